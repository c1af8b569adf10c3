"""`sglfleet generate` as a process watched from outside: metrics, `job status`, signals, the key."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.generate import (
    assert_exactly_once,
    fleet,
    generate_argv,
    requests_served,
    write_batch,
    write_conversations,
)
from support.polling import wait_until

from sglfleet.cli import main as cli_main
from sglfleet.gen import load_manifest as load
from sglfleet.gen import manifest_path

pytestmark = pytest.mark.timeout(90)


def _generate(inp: Path, out: Path, urls: list[str], *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    argv = generate_argv(inp, out, urls, "--log-interval", "3600")
    return subprocess.Popen(
        [*argv, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _job_status(out: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, "-m", "sglfleet", "job", "status", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name}{labels} not in:\n{text[:2000]}"
    return float(match.group(1))


def test_metrics_and_job_status_while_it_runs_and_after(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 300)
    with fleet({"standin_ttft": 0.02, "max_running_requests": 2}) as servers:
        url = servers[0].base_url
        proc = _generate(inp, out, [url], "--concurrency", "2", "--metrics-port", "0")
        line = proc.stderr.readline()  # type: ignore[union-attr]
        match = re.search(r"metrics on (http://\S+/metrics)", line)
        assert match, line
        wait_until(
            lambda: out.exists() and out.read_bytes().count(b"\n") >= 20,
            timeout=30,
            what="20 results written",
        )
        with urllib.request.urlopen(match.group(1), timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        assert 20 <= _metric(text, "sglfleet_generate_requests_done_total") < 300
        assert _metric(text, "sglfleet_generate_requests_total") == 300
        assert _metric(text, "sglfleet_generate_requests_failed_total") == 0
        assert _metric(text, "sglfleet_generate_tokens_total", '{kind="completion"}') > 0
        assert _metric(text, "sglfleet_generate_in_flight", f'{{endpoint="{url}"}}') <= 2
        assert _metric(text, "sglfleet_generate_endpoint_up", f'{{endpoint="{url}"}}') == 1
        assert _metric(text, "sglfleet_generate_request_latency_seconds_count", f'{{endpoint="{url}"}}') >= 20

        wait_until(
            lambda: (load(manifest_path(out)) or object()).__class__.__name__ == "Manifest",
            timeout=30,
            what="the manifest written",
        )
        code, running = _job_status(out)
        assert code == 10 and running["state"] == "running" and running["running"] is True
        assert running["total"] == 300 and running["done"] <= 300
        assert proc.wait(60) == 0, proc.stderr.read()  # type: ignore[union-attr]
    code, done = _job_status(out)
    assert code == 0 and done["state"] == "complete" and done["done"] == 300 and not done["running"]
    text = subprocess.run(
        [sys.executable, "-m", "sglfleet", "job", "status", str(out)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert "complete" in text and "300/300 done (100.0%), 0 failed" in text
    assert_exactly_once(out, ids)


def test_job_status_of_a_killed_job_says_stopped(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 400)
    with fleet({"standin_ttft": 0.05, "max_running_requests": 2}) as servers:
        proc = _generate(inp, out, [servers[0].base_url], "--concurrency", "2")
        wait_until(
            lambda: out.exists() and out.read_bytes().count(b"\n") >= 5,
            timeout=30,
            what="5 results written",
        )
        proc.kill()
        proc.wait()
    code, st = _job_status(out)
    assert code == 11 and st["state"] == "stopped" and not st["running"]
    assert cli_main(["job", "status", str(tmp_path / "none.jsonl")]) == 2


def test_the_manifest_is_rewritten_on_its_own_timer(tmp_path: Path) -> None:
    from sglfleet.gen import ExitCode, GenerateConfig, LogReporter, run

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 150)
    seen: set[int] = set()
    with fleet({"standin_ttft": 0.02, "max_running_requests": 2}) as servers:
        import threading

        config = GenerateConfig(
            input=inp, output=out, endpoints=[servers[0].base_url], concurrency=2, manifest_interval=0.2
        )
        done: list[int] = []

        def job() -> None:
            done.append(
                run(config, LogReporter(io.StringIO(), interval=3600), handle_signals=False).exit_code
            )

        thread = threading.Thread(target=job)
        thread.start()
        while thread.is_alive():
            with_manifest = manifest_path(out)
            if with_manifest.exists():
                seen.add(with_manifest.stat().st_mtime_ns)
            time.sleep(0.02)
    assert done == [ExitCode.OK]
    assert len(seen) >= 4, "rewritten every 0.2 s whatever the log interval (3600 s)"


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3])
def test_sigterm_at_any_moment_of_our_code_exits_130(tmp_path: Path, delay: float) -> None:
    """From the moment the interpreter runs our first line (it then catches SIGTERM) on."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 20)
    with fleet({"standin_ttft": 0.2}) as servers:
        url = servers[0].base_url
        proc = subprocess.Popen(
            generate_argv(inp, out, [url]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def catches() -> bool:
            assert proc.poll() is None
            return _catches_sigterm(proc.pid)

        wait_until(catches, timeout=20, what="the job's SIGTERM handler installed", interval=0.0005)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 130, proc.communicate()


def test_an_interrupt_does_not_mark_endpoints_down(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 50)
    with fleet({"standin_ttft": 2.0}) as servers:
        url = servers[0].base_url
        proc = _generate(inp, out, [url], "--concurrency", "4", "--grace", "0")
        wait_until(
            lambda: (m := load(manifest_path(out))) is not None and m.status == "running",
            timeout=30,
            what="the manifest says running",
        )
        wait_until(
            lambda: requests_served(url) >= 0 and _in_flight(out) > 0,
            timeout=30,
            what="requests in flight",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    m = load(manifest_path(out))
    assert m is not None and m.status == "interrupted"
    assert m.endpoint_stats[url]["up"] == 1.0 and m.endpoint_stats[url]["errors"] == 0


def _in_flight(out: Path) -> float:
    m = load(manifest_path(out))
    return sum(s.get("in_flight", 0) for s in m.endpoint_stats.values()) if m else 0


def test_the_api_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    ids = write_batch(inp, 5)
    keyfile = tmp_path / "key"
    keyfile.write_text("sekrit\n")
    with fleet({"api_key": "sekrit"}) as servers:
        url = servers[0].base_url
        denied = _generate(inp, tmp_path / "o0.jsonl", [url])
        assert denied.wait(30) == 4
        assert "401 Unauthorized from" in denied.stderr.read()  # type: ignore[union-attr]
        by_env = _generate(inp, tmp_path / "o1.jsonl", [url], env={"SGLFLEET_API_KEY": "sekrit"})
        by_file = _generate(inp, tmp_path / "o2.jsonl", [url], "--api-key-file", str(keyfile))
        assert by_env.wait(30) == 0 and by_file.wait(30) == 0
    assert_exactly_once(tmp_path / "o1.jsonl", ids)
    assert_exactly_once(tmp_path / "o2.jsonl", ids)
    assert (
        cli_main(
            ["generate", "-i", str(inp), "-o", str(tmp_path / "o3"), "-e", url, "--api-key-file", "/nope"]
        )
        == 2
    )
