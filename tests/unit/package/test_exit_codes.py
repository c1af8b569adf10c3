"""One exit-code scheme for `sglfleet mix`, `merge` and `generate` (docs/exit-codes.md): each code pinned
by a real run of the command that ends with it."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.generate import fleet, write_batch
from support.paths import REPO
from support.polling import wait_until

from sglfleet.exitcodes import ExitCode

pytestmark = pytest.mark.timeout(120)
SGLFLEET = [sys.executable, "-m", "sglfleet"]


def _cli(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SGLFLEET, *args], capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def _small_files(limit: int):  # type: ignore[no-untyped-def]
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_the_documented_table_is_the_scheme() -> None:
    text = (REPO / "docs/exit-codes.md").read_text()
    rows = {int(code): name for code, name in re.findall(r"^\| *(\d+) \| `([A-Z_]+)` \|", text, re.M)}
    assert rows == {code.value: code.name for code in ExitCode}
    from sglfleet.gen import ExitCode as EngineExitCode

    assert EngineExitCode is ExitCode


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with fleet({}, {"api_key": "right"}, {"standin_error_rate": 1.0}, {"standin_hang_rate": 1.0}) as fleet_:
        yield dict(zip(("ok", "keyed", "erring", "hanging"), (s.base_url for s in fleet_), strict=True))


@pytest.fixture
def inp(tmp_path: Path) -> Path:
    write_batch(tmp_path / "in.jsonl", 4)
    return tmp_path / "in.jsonl"


def test_generate_codes(tmp_path: Path, inp: Path, servers: dict[str, str]) -> None:
    def gen(out: str, url: str, *args: str) -> int:
        return _cli("generate", "-i", str(inp), "-o", str(tmp_path / out), "-e", url, *args).returncode

    assert gen("ok.jsonl", servers["ok"]) == ExitCode.OK == 0
    assert gen("bad.jsonl", servers["ok"], "--temperature", "nan") == ExitCode.BAD_INPUT == 2
    assert gen("fail.jsonl", servers["erring"], "--max-retries", "0") == ExitCode.FAILURES == 3
    (tmp_path / "key").write_text("wrong\n")
    assert gen("auth.jsonl", servers["keyed"], "--api-key-file", str(tmp_path / "key")) == ExitCode.AUTH == 4
    assert gen("k.jsonl", servers["keyed"], "--api-key-file", str(inp)) == ExitCode.BAD_INPUT  # two lines
    dead = "http://127.0.0.1:9"
    assert gen("none.jsonl", dead, "--probe-timeout", "1") == ExitCode.NO_ENDPOINT == 5
    with inp.open("a") as fh:  # the input grew since ok.jsonl was generated from it
        fh.write(inp.read_text().splitlines()[0].replace("b000000", "b000099") + "\n")
    assert gen("ok.jsonl", servers["ok"]) == ExitCode.INPUT_CHANGED == 6
    full = _cli("generate", "-i", str(inp), "-o", str(tmp_path / "full.jsonl"), "-e", servers["ok"],
                preexec_fn=_small_files(600))  # fmt: skip
    assert full.returncode == ExitCode.DISK_FULL == 7, full.stderr
    out = tmp_path / "hung.jsonl"
    argv = [*SGLFLEET, "generate", "-i", str(inp), "-o", str(out), "-e", servers["hanging"], "--grace", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mpath = tmp_path / "hung.jsonl.manifest.json"
    wait_until(mpath.exists, timeout=30, what="the job running (its first manifest)")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == ExitCode.INTERRUPTED == 130, err


@pytest.fixture
def lab_mix(tmp_path: Path) -> dict[str, Path]:
    prompts = tmp_path / "prompts.jsonl"
    assert _cli("mix", "--config", str(REPO / "examples/mix/lab-mix.yaml"), "--output", str(prompts),
                "--no-cache").returncode == ExitCode.OK  # fmt: skip
    existing = REPO / "examples/mix/existing-train.jsonl"
    results = tmp_path / "results.jsonl"
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    with results.open("w") as fh:
        for r in rows:
            body = {"choices": [{"message": {"role": "assistant", "content": "an answer " * 20},
                                 "finish_reason": "stop"}], "usage": {"completion_tokens": 40}}  # fmt: skip
            fh.write(json.dumps({"custom_id": r["custom_id"], "response": {"status_code": 200, "body": body},
                                 "error": None}) + "\n")  # fmt: skip
    return {"prompts": prompts, "existing": existing, "results": results}


def test_mix_and_merge_codes(tmp_path: Path, lab_mix: dict[str, Path]) -> None:
    config = REPO / "examples/mix/lab-mix.yaml"
    assert (
        _cli(
            "mix", "--config", str(tmp_path / "missing.yaml"), "--output", str(tmp_path / "p.jsonl")
        ).returncode
        == 2
    )
    full = _cli("mix", "--config", str(config), "--output", str(tmp_path / "p.jsonl"), "--no-cache",
                preexec_fn=_small_files(4096))  # fmt: skip
    assert full.returncode == ExitCode.DISK_FULL, full.stderr
    without_extra = (
        "import sys; sys.modules['datasketch'] = None; sys.argv[1:] = "
        f"{['mix', '--config', str(config), '--output', str(tmp_path / 'p.jsonl')]!r}; "
        "from sglfleet.cli import run; run()"
    )
    missing = subprocess.run(
        [sys.executable, "-c", without_extra], capture_output=True, text=True, check=False
    )
    assert missing.returncode == ExitCode.FATAL == 1, missing.stderr
    assert "install the mix extra" in missing.stderr and "Traceback" not in missing.stderr

    merge = ["merge", "--existing", str(lab_mix["existing"]), "--results", str(lab_mix["results"]),
             "--prompts", str(lab_mix["prompts"]), "--no-cache", "--output"]  # fmt: skip
    assert _cli(*merge, str(tmp_path / "m.jsonl")).returncode == ExitCode.OK
    assert _cli(*merge, str(REPO)).returncode == ExitCode.BAD_INPUT  # a directory
    full = _cli(*merge, str(tmp_path / "m2.jsonl"), preexec_fn=_small_files(4096))
    assert full.returncode == ExitCode.DISK_FULL, full.stderr
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
