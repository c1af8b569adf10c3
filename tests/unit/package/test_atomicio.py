"""sglfleet.atomicio's file modes (a secret is never readable by others, not even while it is written) and
the rename that moves a staged copy into place."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from sglfleet import atomicio


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_0600_file_is_0600_from_birth_and_replaces_a_readable_one(tmp_path: Path) -> None:
    path = tmp_path / "instance-0.env"
    path.write_text("OLD=1\n")
    path.chmod(0o644)
    old_umask = os.umask(0)  # the most permissive umask: the mode must not come from it
    try:
        with atomicio.atomic_write(path, mode=0o600) as fh:
            (tmp,) = [p for p in tmp_path.iterdir() if p != path]
            assert _mode(tmp) == 0o600 and path.read_text() == "OLD=1\n"
            fh.write(b"KEY=s3cret\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "KEY=s3cret\n" and _mode(path) == 0o600
    assert sorted(tmp_path.iterdir()) == [path]


def test_write_text_defaults_to_0644_and_a_failure_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.env"
    atomicio.write_text(path, "A=1\n")
    assert path.read_text() == "A=1\n" and _mode(path) == 0o644
    with pytest.raises(RuntimeError), atomicio.atomic_write(path, mode=0o600) as fh:
        fh.write(b"half")
        raise RuntimeError("disk full")
    assert path.read_text() == "A=1\n" and _mode(path) == 0o644
    assert sorted(path.parent.iterdir()) == [path]


def test_move_into_place_renames_a_staged_copy_over_the_file_and_replaces_a_symlink_itself(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "shared.jsonl"
    elsewhere.write_text("theirs\n")
    (tmp_path / "train").mkdir()
    path = tmp_path / "train" / "data.jsonl"
    path.symlink_to(elsewhere)
    staged = tmp_path / "train" / ".data.jsonl.staged"
    staged.write_text("new\n")
    atomicio.move_into_place(staged, path)
    assert path.read_text() == "new\n" and not path.is_symlink() and not staged.exists()
    assert elsewhere.read_text() == "theirs\n"  # the file the link named is not the writer's to replace


def test_move_into_place_refuses_a_fifo_and_a_copy_in_another_directory(tmp_path: Path) -> None:
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    staged = tmp_path / "staged"
    staged.write_text("new\n")
    with pytest.raises(OSError, match=r"is a FIFO \(named pipe\)"):
        atomicio.move_into_place(staged, fifo)
    assert staged.read_text() == "new\n" and stat.S_ISFIFO(fifo.stat().st_mode)
    (tmp_path / "other").mkdir()
    with pytest.raises(OSError, match="a rename cannot move it in"):
        atomicio.move_into_place(staged, tmp_path / "other" / "data.jsonl")
    assert staged.exists() and not (tmp_path / "other" / "data.jsonl").exists()


def test_every_rename_of_the_package_is_atomicios() -> None:
    """One atomic rename serves every writer: no other module renames a file into place itself."""
    package = Path(atomicio.__file__).resolve().parent
    elsewhere = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.name != "atomicio.py"
        and re.search(r"\bos\.(replace|rename)\(", path.read_text(encoding="utf-8"))
    ]
    assert not elsewhere, f"write through sglfleet.atomicio instead: {elsewhere}"
