"""One output-path check for every writer (issue 28, points 1 and 6).

`generate` (output, errors file, manifest), `mix` (output, report) and `merge` (output, report, its
.json) refuse, with exit 2 and before anything is written, an output that is not a regular file: a
directory, a FIFO, a socket, or a symlink to one or to a device (`/dev/null` through a symlink: no real
device node is ever made here), and an output that is an input under another name (symlink, hard link).
A second mix or merge to the same output fails at once while the first one holds its lock.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet.cli import main
from sglfleet.outpath import lock_path, output_lock, output_problem

pytestmark = pytest.mark.timeout(120)

EXAMPLE = REPO / "examples/mix"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    yield path
    server.close()


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _dir(tmp: Path) -> Path:
    (tmp / "adir").mkdir()
    return tmp / "adir"


def _link(name: str, to: Path | str, tmp: Path) -> Path:
    (tmp / name).symlink_to(to)
    return tmp / name


# What each hostile path is made of, and the words the refusal must use for it.
HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (_fifo, "is a FIFO (named pipe)"),
    "directory": (_dir, "is a directory"),
    "symlink to /dev/null": (lambda t: _link("null", "/dev/null", t), "/dev/null, a character device"),
    "symlink to a fifo": (lambda t: _link("to-fifo", _fifo(t), t), "a FIFO (named pipe)"),
    "symlink to a directory": (lambda t: _link("to-dir", _dir(t), t), "a directory"),
}


def _hostile(kind: str, tmp: Path, sock: Path) -> tuple[Path, str]:
    if kind == "socket":
        return sock, "is a socket"
    if kind == "symlink to a socket":
        return _link("to-sock", sock, tmp), "a socket"
    make, words = HOSTILE[kind]
    return make(tmp), words


KINDS = [*HOSTILE, "socket", "symlink to a socket"]


def _state(path: Path) -> tuple[int, int]:
    st = path.stat()
    return stat.S_IFMT(st.st_mode), st.st_ino


def _assert_untouched(path: Path, before: tuple[int, int], link_before: str | None) -> None:
    assert _state(path) == before
    if link_before is not None:
        assert os.readlink(path) == link_before
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)  # the device is still a device


def _one_error(capsys: pytest.CaptureFixture, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err


def _prompts_and_results(lab: Path, tmp_path: Path) -> dict[str, Path]:
    prompts = tmp_path / "prompts.jsonl"
    assert main(["mix", "--config", str(lab / "lab-mix.yaml"), "--output", str(prompts)]) == 0
    ids = [json.loads(line)["custom_id"] for line in prompts.read_text().splitlines()]
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "an answer " * 10}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45},
    }
    results = tmp_path / "results.jsonl"
    results.write_text(
        "".join(
            json.dumps({"custom_id": c, "response": {"status_code": 200, "body": body}, "error": None}) + "\n"
            for c in ids
        )
    )
    return {"existing": lab / "existing-train.jsonl", "results": results, "prompts": prompts}


def _merge(inputs: dict[str, Path], *extra: str) -> int:
    return main(["merge", *(a for k, v in inputs.items() for a in (f"--{k}", str(v))), *extra])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flag", ["--output", "--report"])
def test_mix_refuses_what_is_not_a_regular_file(  # noqa: PLR0917 (fixtures and parameters)
    lab: Path, tmp_path: Path, sock: Path, capsys: pytest.CaptureFixture, kind: str, flag: str
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path, words = _hostile(kind, scratch, sock)
    if flag == "--report" and kind in {"fifo", "socket"}:
        path = path.rename(scratch / f"{path.name}.md") if kind == "fifo" else path
    before, link = _state(path), (os.readlink(path) if path.is_symlink() else None)
    args = {"--output": str(tmp_path / "p.jsonl"), "--report": str(tmp_path / "r.md"), flag: str(path)}
    assert main(["mix", "--config", str(lab / "lab-mix.yaml"), *(a for kv in args.items() for a in kv)]) == 2
    err = _one_error(capsys, "mix")
    assert f"{flag} {path}" in err and words in err, err
    _assert_untouched(path, before, link)
    assert not (tmp_path / "p.jsonl").exists() and not (tmp_path / "r.md").exists()
    assert sorted(p.name for p in scratch.iterdir() if p.name.endswith(".lock")) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flag", ["--output", "--report"])
def test_merge_refuses_what_is_not_a_regular_file(  # noqa: PLR0917 (fixtures and parameters)
    lab: Path, tmp_path: Path, sock: Path, capsys: pytest.CaptureFixture, kind: str, flag: str
) -> None:
    inputs = _prompts_and_results(lab, tmp_path)
    capsys.readouterr()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path, words = _hostile(kind, scratch, sock)
    before, link = _state(path), (os.readlink(path) if path.is_symlink() else None)
    args = {"--output": str(tmp_path / "merged.jsonl"), flag: str(path)}
    assert _merge(inputs, *(a for kv in args.items() for a in kv)) == 2
    err = _one_error(capsys, "merge")
    assert f"{flag} {path}" in err and words in err, err
    _assert_untouched(path, before, link)
    assert not (tmp_path / "merged.jsonl").exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["output", "errors file", "manifest"])
def test_generate_refuses_what_is_not_a_regular_file(
    tmp_path: Path, sock: Path, capsys: pytest.CaptureFixture, kind: str, which: str
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n')
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path, words = _hostile(kind, scratch, sock)
    out = {
        "output": path,
        "errors file": scratch / "o.jsonl",
        "manifest": scratch / "o.jsonl",
    }[which]
    if which != "output":  # the sidecar takes the hostile path's place
        side = {"errors file": ".errors.jsonl", "manifest": ".manifest.json"}[which]
        path = path.rename(scratch / f"o.jsonl{side}")
    before, link = _state(path), (os.readlink(path) if path.is_symlink() else None)
    code = main(["generate", "-i", str(inp), "-o", str(out), "-e", "http://127.0.0.1:9"])
    assert code == 2
    err = _one_error(capsys, "generate")
    assert str(path) in err and words in err, err
    _assert_untouched(path, before, link)


def test_an_input_under_another_name_is_refused_by_every_writer(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    inputs = _prompts_and_results(lab, tmp_path)
    capsys.readouterr()
    results = inputs["results"]
    hard = tmp_path / "hard.jsonl"
    os.link(results, hard)
    soft = _link("soft.jsonl", results, tmp_path)
    kept = results.read_bytes()
    for other in (results, hard, soft):
        assert _merge(inputs, "--output", str(other)) == 2
        assert "is the results" in _one_error(capsys, "merge")
        prompts = inputs["prompts"]
        code = main(["generate", "-i", str(prompts), "-o", str(other), "-e", "http://127.0.0.1:9"])
        assert code == 2 or other == results  # the results are no input of generate ...
    assert results.read_bytes() == kept
    os.link(inputs["prompts"], tmp_path / "hard-prompts.jsonl")
    for other in (inputs["prompts"], tmp_path / "hard-prompts.jsonl"):
        code = main(["generate", "-i", str(inputs["prompts"]), "-o", str(other), "-e", "http://127.0.0.1:9"])
        assert code == 2
        assert "is the input" in _one_error(capsys, "generate")


def test_a_symlink_to_a_regular_file_is_written_through(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    real = tmp_path / "elsewhere" / "p.jsonl"
    real.parent.mkdir()
    real.write_text("old\n")
    link = _link("p.jsonl", real, tmp_path)
    assert main(["mix", "--config", str(lab / "lab-mix.yaml"), "--output", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link stays, what it names is new
    assert real.read_text() != "old\n" and real.read_text().count("\n") > 1


def test_a_second_merge_or_mix_to_the_same_output_fails_at_once(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    inputs = _prompts_and_results(lab, tmp_path)
    out = tmp_path / "merged.jsonl"
    out.write_text("the first writer's\n")
    capsys.readouterr()
    with output_lock([out], "sglfleet merge"):  # what a merge running now holds
        assert _merge(inputs, "--output", str(out)) == 2
        err = _one_error(capsys, "merge")
        assert f"{out} is being written by another sglfleet merge" in err, err
        assert main(["mix", "--config", str(lab / "lab-mix.yaml"), "--output", str(out)]) == 2
        assert "being written by another" in _one_error(capsys, "mix")
        assert out.read_text() == "the first writer's\n"
    assert _merge(inputs, "--output", str(out)) == 0  # the lock went with its holder ...
    assert not lock_path(out).exists()  # ... and so did its file


def test_output_problem_names_the_path_and_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f")
    assert output_problem(tmp_path / "f", "--output") == (
        f"--output {tmp_path / 'f'} is a FIFO (named pipe): give a file path"
    )
    (tmp_path / "n").symlink_to("/dev/null")
    assert output_problem(tmp_path / "n", "--report") == (
        f"--report {tmp_path / 'n'} is a symlink to /dev/null, a character device: give a file path"
    )
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x.jsonl")
    assert output_problem(tmp_path / "dangling", "--output") is None  # what it names gets created
    assert output_problem(tmp_path / "new" / "x.jsonl", "--output") is None


def _protected_symlinks() -> bool:
    try:
        return Path("/proc/sys/fs/protected_symlinks").read_text().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(
    os.geteuid() != 0 or not _protected_symlinks(), reason="needs root and fs.protected_symlinks"
)
def test_root_does_not_follow_another_users_link_in_a_sticky_directory(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A link planted in a /tmp-like directory by another user (here: nobody) towards a file of its
    choice is not followed by root's write (the kernel's fs.protected_symlinks rule)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = _link("out.jsonl", victim, shared)
    os.lchown(planted, 65534, 65534)
    assert main(["mix", "--config", str(lab / "lab-mix.yaml"), "--output", str(planted)]) != 0
    assert victim.read_text() == "precious\n"
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("writer", ["merge", "mix"])
def test_the_reports_chart_is_checked_like_the_report(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture, writer: str
) -> None:
    """`--report R.md` also writes R.png (the shares chart): a chart path that is an input (here the
    existing set, saved as `train.png`) is refused before anything is written, as R.md and R.json
    are. Before this check the chart replaced the existing training set (a second reader, issue 28)."""
    inputs = _prompts_and_results(lab, tmp_path)
    capsys.readouterr()
    existing = tmp_path / "train.png"
    shutil.copy(inputs["existing"], existing)
    kept = existing.read_bytes()
    report = tmp_path / "train.md"
    if writer == "merge":
        code = _merge(
            {**inputs, "existing": existing}, "--output", str(tmp_path / "m.jsonl"), "--report", str(report)
        )
    else:
        config = tmp_path / "mix.yaml"
        text = (lab / "lab-mix.yaml").read_text()
        text = text.replace("existing-train.jsonl", f"{existing}\n  type: jsonl")
        config.write_text(text.replace("sources/", f"{lab}/sources/"))
        assert str(existing) in config.read_text()
        code = main(
            ["mix", "--config", str(config), "--output", str(tmp_path / "p.jsonl"), "--report", str(report)]
        )
    assert code == 2
    err = _one_error(capsys, writer)
    assert f"--report (its .png chart) {existing} is the existing set" in err, err
    assert existing.read_bytes() == kept
    assert not report.exists() and not report.with_suffix(".json").exists()
