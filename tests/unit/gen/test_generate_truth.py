"""What `sglfleet generate` says is what happened (issue 20): no answer that is not one counted as done,
no re-sent request left hanging on a second frozen instance, no flag silently ignored, reasoning kept,
a status and exit messages a user can act on. Real stand-in servers on 127.0.0.1, real files."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sglfleet_testing.standin.process import free_port
from support.generate import (
    Background,
    assert_exactly_once,
    count_lines,
    fleet,
    generate_argv,
    job_config,
    latency_servers,
    read_jsonl,
    requests_served,
    run_job,
    write_batch,
    write_conversations,
)
from support.polling import wait_until

from sglfleet.data import merge
from sglfleet.gen import ExitCode, GenerateConfig, GenParams, LogReporter, manifest_path, run
from sglfleet.gen import load_manifest as load

pytestmark = pytest.mark.timeout(120)


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(sglfleet_generate_\w+) ([0-9.e+-]+)$", text, re.M)}


def _scrape(port: int) -> dict[str, float]:
    try:
        return _metrics(port)
    except OSError:
        return {}


# -- 3. a 200 whose choice holds no answer -------------------------------------------------------------


def test_an_empty_choice_is_retried_then_reported_never_counted_done(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 12)
    with latency_servers(1, 0.0, "empty_choice") as urls:
        ok = run_job(inp, out, urls)
        assert ok.exit_code == ExitCode.OK and ok.manifest is not None, ok.message
        assert ok.manifest.counts.retries_this_run == 12  # every first answer was {"choices": [{}]}
        assert_exactly_once(out, ids)
    out2 = tmp_path / "out2.jsonl"
    with latency_servers(1, 0.0, "empty_choice") as urls:  # a fresh server: first attempts again
        failed = run_job(inp, out2, urls, max_retries=0)
    assert failed.exit_code == ExitCode.FAILURES, failed.message
    assert out2.read_bytes() == b"", "an empty choice is never written as a result"
    errors = read_jsonl(tmp_path / "out2.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == ids
    assert all(e["error"]["code"] == "invalid_response" for e in errors)
    assert "choices[0] has neither message.content nor text" in errors[0]["error"]["message"]


def test_content_null_from_a_thinking_model_is_retried_then_reported_and_rerun(tmp_path: Path) -> None:
    """SGLang with --reasoning-parser answers ``content: null`` when the answer is all reasoning (cut by
    max_tokens while thinking): not a completion; the ids go to the errors file and a rerun sends them."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 6, max_tokens=1)
    with fleet({"reasoning_parser": "qwen3"}) as servers:
        url = servers[0].base_url
        outcome = run_job(inp, out, [url], max_retries=1)
        assert outcome.exit_code == ExitCode.FAILURES, outcome.message
        assert out.read_bytes() == b""
        errors = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
        assert sorted(e["custom_id"] for e in errors) == ids
        assert "choices[0].message.content is null" in errors[0]["error"]["message"]
        assert errors[0]["response"]["body"]["choices"][0]["message"]["reasoning_content"]
        # the rerun sends them again (with room to answer after thinking, they are done)
        again = run_job(inp, out, [url], params=GenParams(max_tokens=64), force=True)
    assert again.exit_code == ExitCode.OK, again.message
    assert_exactly_once(out, ids)


# -- 2. a re-sent request whose second endpoint stalls too --------------------------------------------


def test_two_instances_frozen_one_after_the_other_end_near_the_stall_window(tmp_path: Path) -> None:
    """The field case (two instances frozen 14 s apart, 600 s request timeout) scaled down: requests of
    about 1 s, instance A frozen, then B frozen while A's re-sent requests run on it. Each stall sends
    them on again, so the job ends seconds after the second freeze, not at the 60 s request timeout."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 60, max_tokens=8)
    port = free_port()
    flags = {"standin_ttft": 1.0, "max_running_requests": 4}
    with fleet(flags, flags, flags) as servers:
        a, b, _ = servers
        config = job_config(
            inp,
            out,
            [s.base_url for s in servers],
            concurrency=4,
            request_timeout=60,
            stall_factor=2.0,
            stall_min=1.0,
            metrics_port=port,
        )
        job = Background(config)
        try:
            wait_until(lambda: count_lines(out) >= 6, timeout=30, what="the first results")
            os.kill(a.process.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            # A's requests go elsewhere; freeze B while they run there
            wait_until(
                lambda: _scrape(port).get("sglfleet_generate_requests_resent_total", 0) >= 1,
                timeout=30,
                what="a request re-sent",
            )
            os.kill(b.process.pid, signal.SIGSTOP)
            outcome = job.join(90)
            after = time.monotonic() - t0
        finally:
            os.kill(a.process.pid, signal.SIGCONT)
            os.kill(b.process.pid, signal.SIGCONT)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert after < 30, f"the job took {after:.1f} s after the first freeze (request timeout 60 s)"
    assert_exactly_once(out, ids)
    m = outcome.manifest
    assert m is not None
    assert m.endpoint_stats[a.base_url]["stalls"] >= 1 and m.endpoint_stats[b.base_url]["stalls"] >= 1


# -- 4. reasoning_content through generate and merge, every input format -------------------------------


def _mix_like(path: Path, n: int) -> list[str]:
    """What `sglfleet mix` writes: OpenAI Batch lines whose bodies carry max_tokens 512."""
    ids = [f"mix-{i:04d}" for i in range(n)]
    with path.open("w") as fh:
        for i, cid in enumerate(ids):
            body = {"messages": [{"role": "user", "content": f"explain thing {i}"}], "max_tokens": 512}
            line = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
            fh.write(json.dumps({**line, "metadata": {"category": "chat"}}) + "\n")
    return ids


def _existing(path: Path) -> Path:
    row = {
        "id": "old",
        "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["batch", "conversation"])
def test_reasoning_is_kept_through_generate_and_merge(tmp_path: Path, fmt: str) -> None:
    """SpecForge's regenerate_train_data.py --reasoning save keeps each answer's ``reasoning_content``
    in its assistant turn; --keep-reasoning does the same on either input format, and merge keeps it."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = _mix_like(inp, 3) if fmt == "batch" else write_conversations(inp, 3)
    with fleet({"reasoning_parser": "qwen3", "standin_natural_tokens": "40:60"}) as servers:
        outcome = run_job(
            inp, out, [servers[0].base_url], params=GenParams(max_tokens=200, keep_reasoning=True)
        )
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)
    merged = tmp_path / "merged.jsonl"
    merge(_existing(tmp_path / "existing.jsonl"), out, None, merged, min_completion_tokens=1)
    rows = [json.loads(line) for line in merged.read_text().splitlines()][1:]
    assert sorted(r["id"] for r in rows) == ids
    for row in rows:
        answer = row["conversations"][-1]
        assert answer["role"] == "assistant" and answer["content"]
        assert answer["reasoning_content"], row  # 3 of 3, as the stand-in thought before answering


def test_turns_all_on_batch_input_is_refused_not_ignored(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _mix_like(inp, 2)
    with fleet({}) as servers:
        outcome = run_job(inp, out, [servers[0].base_url], params=GenParams(turns="all"))
    assert outcome.exit_code == ExitCode.BAD_INPUT, outcome.message
    assert "--turns all applies to conversation input" in outcome.message
    assert not out.exists() or out.read_bytes() == b""


# -- 5. a flag the user gave wins over the body ----------------------------------------------------------


def test_a_sampling_flag_wins_over_the_body_and_the_manifest_records_what_was_sent(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = _mix_like(inp, 20)  # every body says max_tokens 512
    with latency_servers(1, 0.0, "ok") as urls:
        params = GenParams(max_tokens=64, temperature=0.25, extra={"top_k": 7})
        outcome = run_job(inp, out, urls, params=params)
        with urllib.request.urlopen(urls[0] + "/bodies", timeout=5) as resp:
            sent = json.loads(resp.read())
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)
    assert len(sent) == 20
    assert {(b["max_tokens"], b["temperature"], b["top_k"]) for b in sent} == {(64, 0.25, 7)}
    m = load(manifest_path(out))
    assert m is not None and m.params["max_tokens"] == 64 and m.params["temperature"] == 0.25


# -- 6. status, ETA, exit messages, 401, final metrics ------------------------------------------------


def _cli(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglfleet", *args], capture_output=True, text=True, check=False, **kw
    )  # type: ignore[call-overload]


def test_job_status_counts_the_results_on_disk_when_the_manifest_lags(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 400)
    with fleet({"standin_ttft": 0.02, "max_running_requests": 2}) as servers:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglfleet", "generate", "-i", str(inp), "-o", str(out),
             "-e", servers[0].base_url, "-c", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(lambda: count_lines(out) >= 20, timeout=30, what="20 results")
            proc.kill()  # kill -9 before the manifest's first periodic rewrite (every 5 s)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
    m = load(manifest_path(out))
    on_disk = count_lines(out)
    assert m is not None and m.counts.done < on_disk  # the manifest lags behind the output
    status = _cli("job", "status", str(out), "--json")
    assert status.returncode == 11, status.stderr
    st = json.loads(status.stdout)
    assert st["state"] == "stopped"
    assert st["done"] == on_disk and st["remaining"] == 400 - on_disk
    assert f"{on_disk}/400 done" in _cli("job", "status", str(out)).stdout


class _Logged(Background):
    """A job on a thread whose progress log lines (every 0.2 s) the test reads."""

    def __init__(self, config: GenerateConfig, log: io.StringIO) -> None:
        self.log = log
        super().__init__(config)

    def _run(self, config: GenerateConfig) -> None:
        self.outcome = run(config, LogReporter(self.log, 0.2), handle_signals=False)


def test_eta_is_unknown_while_requests_hang(tmp_path: Path) -> None:
    """Some requests hang (the stand-in never answers them) and the rest are done: the ETA says
    unknown, in the log and in `job status`, rather than 0:00:00."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 40)
    log = io.StringIO()

    def last() -> str:
        lines = log.getvalue().splitlines()
        return lines[-1] if lines else ""

    with fleet({"standin_hang_rate": 0.1, "standin_seed": 3}) as servers:
        config = job_config(
            inp,
            out,
            [servers[0].base_url],
            request_timeout=20,
            max_retries=0,
            manifest_interval=0.2,
            max_resends=0,  # an overdue request is re-sent by default (and answered): not here
        )
        job = _Logged(config, log)
        wait_until(lambda: "ETA unknown" in last(), timeout=15, what="the log's ETA says unknown")
        done = int(re.search(r"generate: (\d+)/40", last()).group(1))  # type: ignore[union-attr]
        assert 0 < done < 40, last()
        wait_until(
            lambda: "ETA unknown" in _cli("job", "status", str(out)).stdout,
            timeout=15,
            what="job status says ETA unknown",
        )
        outcome = job.join(60)
    assert outcome.exit_code == ExitCode.FAILURES  # the hung ones timed out, reported


def _next_command(stderr: str) -> list[str]:
    line = next(x for x in stderr.splitlines() if x.startswith("next: "))
    argv = shlex.split(line.removeprefix("next: "))
    assert argv[0] == "sglfleet", line
    return argv[1:]


def test_after_exit_6_the_command_it_names_works(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 400)
    lines = inp.read_bytes().splitlines(keepends=True)
    with fleet({"standin_ttft": 0.01, "max_running_requests": 2}) as servers:
        url = servers[0].base_url
        proc = subprocess.Popen(
            generate_argv(inp, out, [url], "-c", "2"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: count_lines(out) >= 5, timeout=30, what="5 results")
        edited = lines[-1].replace(b"prompt 399", b"prompt 999")
        with inp.open("r+b") as fh:  # in place, same size: only the bytes tell
            fh.seek(sum(len(x) for x in lines[:-1]))
            fh.write(edited)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == ExitCode.INPUT_CHANGED, stderr
        assert "rerun to resume" not in stderr
        again = _cli(*_next_command(stderr))
    assert again.returncode == 0, again.stderr
    assert len(read_jsonl(out)) == 400


def test_after_exit_5_the_command_it_names_works_once_the_fleet_is_up(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 5)
    with fleet({}) as servers:
        server = servers[0]
        os.kill(server.process.pid, signal.SIGSTOP)  # not answering (a hung host)
        try:
            down = _cli(
                "generate", "-i", str(inp), "-o", str(out), "-e", server.base_url, "--probe-timeout", "1"
            )
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert down.returncode == ExitCode.NO_ENDPOINT, down.stderr
        again = _cli(*_next_command(down.stderr))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)


def test_a_401_is_an_answer_even_while_another_endpoint_is_down(tmp_path: Path) -> None:
    """One endpoint takes any key and dies after its first answer (after the preflight); the others
    refuse the key: exit 4 at once, not 5 after --down-timeout waiting for the dead one."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 30)
    with fleet({"standin_crash_after": 1}, {"api_key": "right"}, {"api_key": "right"}) as servers:
        t0 = time.monotonic()
        outcome = run_job(inp, out, [s.base_url for s in servers], api_key="wrong", down_timeout=60)
        took = time.monotonic() - t0
    assert outcome.exit_code == ExitCode.AUTH, outcome.message
    assert took < 20, f"{took:.1f} s: a 401 is an answer, no need to wait for the endpoint that is down"
    assert "check the API key" in outcome.message


def test_the_final_metrics_stay_scrapable_after_the_end(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 30)
    port = free_port()
    with fleet({}) as servers:
        job = Background(job_config(inp, out, [servers[0].base_url], metrics_port=port, metrics_linger=10.0))
        wait_until(
            lambda: _scrape(port).get("sglfleet_generate_exit_code") is not None,
            timeout=30,
            what="the exit code in the metrics",
        )
        final = _metrics(port)
        outcome = job.join(60)
    assert outcome.exit_code == ExitCode.OK
    assert final["sglfleet_generate_exit_code"] == 0
    assert final["sglfleet_generate_requests_done_total"] == 30
    assert final["sglfleet_generate_requests_remaining"] == 0


# -- 8. no traceback, nothing silently changed -----------------------------------------------------------


def test_bad_arguments_are_refused_up_front_without_a_traceback(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 3)
    (tmp_path / "d.jsonl.manifest.json").mkdir()
    with fleet({}) as servers:
        url = servers[0].base_url
        cases = {
            "proc": ["-o", "/proc/version"],
            "manifest is a directory": ["-o", str(tmp_path / "d.jsonl")],
            "metrics port": ["-o", str(tmp_path / "a.jsonl"), "--metrics-port", "99999"],
            "nan": ["-o", str(tmp_path / "b.jsonl"), "--temperature", "nan"],
            "inf top-p": ["-o", str(tmp_path / "c.jsonl"), "--top-p", "inf"],
        }
        for name, args in cases.items():
            done = _cli("generate", "-i", str(inp), "-e", url, *args)
            assert done.returncode == ExitCode.BAD_INPUT, (name, done.stdout, done.stderr)
            assert "Traceback" not in done.stderr, (name, done.stderr)
        served = requests_served(url)
    assert served == 0, "nothing is sent when an argument is bad"
    assert not (tmp_path / "b.jsonl").exists() or (tmp_path / "b.jsonl").read_bytes() == b""
