"""`sglfleet mix` / `merge`: inputs are never overwritten, and bad input or a failing disk is one line
naming the file, line and field, with nothing half-written."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from sglfleet.cli import main

pytestmark = pytest.mark.timeout(120)

EXAMPLE = REPO / "examples/mix"


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def one_error_line(capsys: pytest.CaptureFixture, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"sglfleet {command}: error: ") and "Traceback" not in err
    return err


def mix(lab: Path, *args: str) -> int:
    return main(["mix", "--config", str(lab / "lab-mix.yaml"), *args])


def result_line(cid: str, **body_changes) -> dict:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "an answer " * 10}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45},
    }
    body.update(body_changes)
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}


@pytest.fixture
def merge_inputs(lab: Path, tmp_path: Path) -> dict[str, Path]:
    prompts = tmp_path / "prompts.jsonl"
    assert mix(lab, "--output", str(prompts)) == 0
    ids = [json.loads(line)["custom_id"] for line in prompts.read_text().splitlines()]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(result_line(cid)) + "\n" for cid in ids))
    return {"existing": lab / "existing-train.jsonl", "results": results, "prompts": prompts}


def merge_args(inputs: dict[str, Path], **overrides: Path) -> list[str]:
    paths = {**inputs, **overrides}
    return ["merge", *(a for k, v in paths.items() for a in (f"--{k}", str(v)))]


# ---- 1. inputs are sacred ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "target", "names"),
    [
        ("--output", "sources/sharegpt-chat.jsonl", "source 'chat'"),
        ("--report", "sources/openai-math.jsonl", "source 'math'"),
        ("--output", "lab-mix.yaml", "mix config"),
        ("--report", "existing-train.md", "existing set"),  # its .json is not an input, but ...
        ("--report", "sources/alpaca-general.md", "source 'general'"),  # ... this one's .json is
    ],
)
def test_mix_refuses_to_write_over_an_input(  # noqa: PLR0917 (fixtures and parameters)
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, target: str, names: str
) -> None:
    before = snapshot(lab)
    args = {"--output": str(tmp_path / "p.jsonl"), "--report": str(tmp_path / "r.md")}
    args[flag] = str(lab / target)
    if target == "existing-train.md":  # the Markdown next to the existing set is fine: make it collide
        (lab / "existing-train.md").symlink_to(lab / "existing-train.jsonl")
        before = snapshot(lab)
    assert mix(lab, *(a for kv in args.items() for a in kv)) == 2
    err = one_error_line(capsys, "mix")
    assert f"the {names} " in err and "refusing to overwrite an input" in err
    assert snapshot(lab) == before
    assert not (tmp_path / "p.jsonl").exists() and not (tmp_path / "r.md").exists()


def test_mix_refuses_another_name_for_a_source(lab: Path, capsys: pytest.CaptureFixture) -> None:
    os.link(lab / "sources/sharegpt-chat.jsonl", lab / "hardlink.jsonl")  # same inode, other path
    before = snapshot(lab)
    assert mix(lab, "--output", str(lab / "hardlink.jsonl")) == 2
    assert "is the source 'chat'" in one_error_line(capsys, "mix")
    assert snapshot(lab) == before
    assert mix(lab, "--output", str(lab / "out.jsonl"), "--report", str(lab / "out.jsonl")) == 2
    assert "is the same file as --output" in one_error_line(capsys, "mix")


@pytest.mark.parametrize(
    ("flag", "which", "label"),
    [
        ("--report", "existing", "existing set"),
        ("--output", "results", "results"),
        ("--output", "prompts", "prompts"),
        ("--report", "results.md", "results"),  # results.json is not the results file, results.md...
    ],
)
def test_merge_refuses_to_write_over_an_input(  # noqa: PLR0917 (fixtures and parameters)
    merge_inputs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    flag: str,
    which: str,
    label: str,
) -> None:
    if which == "results.md":  # a report whose .json sibling is the results file
        renamed = merge_inputs["results"].with_suffix(".json")
        merge_inputs["results"].rename(renamed)
        merge_inputs["results"] = renamed
        target = renamed.with_suffix(".md")
    else:
        target = merge_inputs[which]
    before = {k: p.read_bytes() for k, p in merge_inputs.items()}
    args = {"--output": str(tmp_path / "merged.jsonl"), "--report": str(tmp_path / "m.md")}
    args[flag] = str(target)
    assert main([*merge_args(merge_inputs), *(a for kv in args.items() for a in kv)]) == 2
    err = one_error_line(capsys, "merge")
    assert f"the {label} " in err and "refusing to overwrite an input" in err
    assert {k: p.read_bytes() for k, p in merge_inputs.items()} == before
    assert not (tmp_path / "merged.jsonl").exists() and not (tmp_path / "m.md").exists()


# ---- 4. errors, not tracebacks -----------------------------------------------------------------


def test_config_that_is_not_utf8_names_the_line(lab: Path, capsys: pytest.CaptureFixture) -> None:
    config = lab / "lab-mix.yaml"
    lines = config.read_bytes().split(b"\n")
    lines[5] = b"# caf\xe9 latin-1"
    config.write_bytes(b"\n".join(lines))
    assert mix(lab, "--output", str(lab / "p.jsonl")) == 2
    assert "lab-mix.yaml:6: not UTF-8 text (byte 0xe9" in one_error_line(capsys, "mix")


def test_outputs_that_cannot_be_written_are_refused_before_any_work(
    lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    read_only = tmp_path / "ro.jsonl"
    read_only.write_text("keep me\n")
    read_only.chmod(0o444)
    assert mix(lab, "--output", str(read_only)) == 2
    assert "ro.jsonl is read-only (mode 0444)" in one_error_line(capsys, "mix")
    assert read_only.read_text() == "keep me\n"
    (tmp_path / "adir").mkdir()
    assert mix(lab, "--output", str(tmp_path / "adir")) == 2
    assert "adir is a directory" in one_error_line(capsys, "mix")
    assert mix(lab, "--output", str(tmp_path / "p.jsonl"), "--report", str(tmp_path / "r.json")) == 2
    assert "give the Markdown report's path" in one_error_line(capsys, "mix")
    assert mix(lab, "--output", str(read_only / "under-a-file.jsonl")) == 2
    assert "under-a-file.jsonl: cannot use it: Not a directory" in one_error_line(capsys, "mix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "mix", "ro.jsonl"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_refused(lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert mix(lab, "--output", str(locked / "p.jsonl")) == 2
    assert "permission denied" in one_error_line(capsys, "mix")


def _limit_file_size(limit: int):
    def apply() -> None:  # a write past the limit fails with EFBIG, as a full disk fails with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_failing_disk_leaves_the_old_outputs_and_no_orphan_report(
    merge_inputs: dict[str, Path], tmp_path: Path
) -> None:
    out, report = tmp_path / "merged.jsonl", tmp_path / "m.md"
    args = [*merge_args(merge_inputs), "--output", str(out)]
    command = [str(Path(sys.executable).parent / "sglfleet")]
    done = subprocess.run(
        [*command, *args, "--report", str(report)],
        capture_output=True,
        check=False,
        text=True,
        preexec_fn=_limit_file_size(4096),
    )
    assert done.returncode == 7  # no room to write (EFBIG, as a full disk): docs/exit-codes.md
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert (
        "cannot write" in done.stderr
        and "File too large" in done.stderr
        and "nothing was written" in done.stderr
    )
    assert not out.exists() and not report.exists()
    assert subprocess.run([*command, *args, "--report", str(report)], check=False).returncode == 0
    before = {p: p.read_bytes() for p in (out, report, report.with_suffix(".json"))}
    bigger = tmp_path / "bigger-existing.jsonl"
    bigger.write_text(merge_inputs["existing"].read_text() * 3)
    size = out.stat().st_size + 100  # room for the old output, not for the new one
    done = subprocess.run(
        [*command, *merge_args(merge_inputs, existing=bigger), "--output", str(out), "--report", str(report)],
        capture_output=True,
        check=False,
        text=True,
        preexec_fn=_limit_file_size(size),
    )
    assert done.returncode == 7, done.stderr
    assert {p: p.read_bytes() for p in before} == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda r: r["response"]["body"]["choices"][0].update(message="just text"),
            r"results\.jsonl:2: custom_id '.*': response\.body\.choices\[0\]\.message is a string, "
            "expected an object",
        ),
        (
            lambda r: r["response"]["body"].update(usage=[1, 2]),
            r"results\.jsonl:2: custom_id '.*': response\.body\.usage is a list, expected an object",
        ),
        (
            lambda r: r["response"]["body"]["usage"].update(completion_tokens="40"),
            r"results\.jsonl:2: .*response\.body\.usage\.completion_tokens is a string, expected an integer",
        ),
        (
            lambda r: r["response"].update(body="oops"),
            r"results\.jsonl:2: .*response\.body is a string, expected an object",
        ),
    ],
)
def test_a_malformed_result_names_line_and_field(
    merge_inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, damage, message: str
) -> None:
    lines = [json.loads(line) for line in merge_inputs["results"].read_text().splitlines()]
    damage(lines[1])
    merge_inputs["results"].write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "merged.jsonl"
    assert main([*merge_args(merge_inputs), "--output", str(out), "--report", str(tmp_path / "m.md")]) == 2
    err = one_error_line(capsys, "merge")
    assert __import__("re").search(message, err), err
    assert not out.exists() and not (tmp_path / "m.md").exists()


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda p: p.update(body=[1]), "body is a list, expected an object with messages"),
        (lambda p: p.update(metadata="code"), "metadata is a string, expected an object"),
        (lambda p: p["body"].update(messages="hi"), "body.messages is a string, expected a list of messages"),
        (lambda p: p["body"]["messages"][0].update(content=7), "body.messages[0].content is a int"),
    ],
)
def test_a_malformed_prompt_names_line_and_field(
    merge_inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, damage, field: str
) -> None:
    lines = [json.loads(line) for line in merge_inputs["prompts"].read_text().splitlines()]
    damage(lines[2])
    merge_inputs["prompts"].write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "merged.jsonl"
    assert main([*merge_args(merge_inputs), "--output", str(out)]) == 2
    err = one_error_line(capsys, "merge")
    assert f"prompts.jsonl:3: {field}" in err
    assert not out.exists()


def test_merge_refuses_existing_rows_that_are_not_conversations(
    merge_inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    existing = tmp_path / "existing.jsonl"
    rows = merge_inputs["existing"].read_text().splitlines()
    rows.insert(3, json.dumps({"category": "code", "junk": 1}))
    existing.write_text("\n".join(rows) + "\n")
    out = tmp_path / "merged.jsonl"
    assert main([*merge_args(merge_inputs, existing=existing), "--output", str(out)]) == 2
    err = one_error_line(capsys, "merge")
    assert "existing.jsonl:4: row has no field 'conversations'" in err and "must hold conversations" in err
    assert not out.exists()
