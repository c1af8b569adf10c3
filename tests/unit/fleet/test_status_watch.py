"""`sglfleet status` says when its ledger is missing, exits 1 when a phase has failed, and `--watch`
redraws it in place (an injected clock, a bounded number of frames: no sleeping)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from sglfleet.cli import build_parser
from sglfleet.cli._watch import watch
from sglfleet.cli.status import status_frame
from sglfleet.fleet import record_phase


def sglfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglfleet", *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip


def _no_instances(ledger: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "status",
        "--ledger",
        str(ledger),
        "--env-dir",
        str(tmp_path / "none"),
        "--nvidia-smi",
        "",
        *extra,
    ]


def test_a_missing_ledger_is_named(tmp_path: Path) -> None:
    ledger = tmp_path / "var" / "ledger.json"
    proc = sglfleet(*_no_instances(ledger, tmp_path), "--width", "160")
    assert proc.returncode == 0, proc.stderr  # nothing has failed: a host no phase has run on yet
    assert f"Phases ({ledger}: missing)" in proc.stdout
    assert "(no ledger at " in proc.stdout  # the summary line says it too
    assert f"no ledger at {ledger} (--ledger)" in proc.stderr
    data = json.loads(sglfleet(*_no_instances(ledger, tmp_path), "--json").stdout)
    assert data["ledger_missing"] is True
    assert data["summary"].startswith(f"0/11 phases done (no ledger at {ledger})")


def test_a_failed_phase_exits_1_and_is_named(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    record_phase(ledger, "provision", "done", {"vmid": 200})
    ok = sglfleet(*_no_instances(ledger, tmp_path))
    assert ok.returncode == 0 and "Phases (" in ok.stdout and "missing" not in ok.stdout
    record_phase(ledger, "toolchain", "failed", {"reason": "ptxas: Unsupported .version 9.5"})
    failed = sglfleet(*_no_instances(ledger, tmp_path))
    assert failed.returncode == 1
    assert "1/11 phases done, failed: toolchain" in failed.stdout


def test_watch_redraws_what_changed(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    record_phase(ledger, "provision", "done", {"vmid": 200})
    args = build_parser(["status"]).parse_args(_no_instances(ledger, tmp_path, "--watch", "3"))
    assert args.watch == 3.0
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # a phase fails while the watcher waits
        slept.append(seconds)
        record_phase(ledger, "sglang", "failed", {"reason": "import error"})

    code = watch(lambda: status_frame(args, console), args.watch, console, sleep=sleep, max_frames=2)
    drawn = Text.from_ansi(console.file.getvalue()).plain  # type: ignore[attr-defined]
    assert slept == [3.0] and code == 1  # the last frame's: a phase has failed
    assert "1/11 phases done; no instances" in drawn
    assert "1/11 phases done, failed: sglang; no instances" in drawn


def test_watch_without_a_value_redraws_every_2_s(tmp_path: Path) -> None:
    args = build_parser(["status"]).parse_args(["status", "--watch"])
    assert args.watch == 2.0
    with pytest.raises(SystemExit):
        build_parser(["status"]).parse_args(["status", "--watch", "-1"])
