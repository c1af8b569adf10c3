"""sglfleet.atomicio's file modes: a secret is never readable by others, not even while it is written."""

from __future__ import annotations

import os
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
