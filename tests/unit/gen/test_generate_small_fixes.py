"""The smaller points of issue 28 (point 7): finite options, a closed pipe, a full disk as job status
tells it, duplicate endpoints under other names, a paused client, and `next:` lines that work."""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.generate import (
    assert_exactly_once,
    count_lines,
    fleet,
    get_json,
    latency_servers,
    run_job,
    write_batch,
)
from support.polling import wait_until

from sglfleet.cli import main
from sglfleet.gen import ExitCode, GenerateConfig, check_config, job_status
from sglfleet.gen._dispatch import Endpoint, EndpointPool, PauseWatch

pytestmark = pytest.mark.timeout(120)


def test_after_a_full_disk_job_status_says_so(tmp_path: Path, small_disk: Path) -> None:
    inp, out = tmp_path / "in.jsonl", small_disk / "out.jsonl"
    write_batch(inp, 400)
    with latency_servers(1, 0.0, "ok") as urls:
        full = run_job(inp, out, urls, manifest_interval=0.05)
    assert full.exit_code == ExitCode.DISK_FULL, full.message
    status = job_status(out)
    assert status.state == "failed" and not status.running
    first = status.lines()[0]
    assert "no space left" in first and "killed before it could say so" not in first, first


# -- a paused client blames no endpoint --------------------------------------------------------------


async def _never(_ep: Endpoint) -> bool:
    return True


def _busy_pool() -> EndpointPool:
    pool = EndpointPool(["http://a:1", "http://b:1"], 4, _never, stall_factor=8.0, stall_min=2.0)
    for ep in pool.endpoints:
        ep.in_flight, ep.latency = 4, 0.2  # busy, answering in 0.2 s: stalled after 2 s of silence
    return pool


def _run(pool: EndpointPool, ticks: list[float], answering: Callable[[float], tuple[int, ...]]) -> list[str]:
    """What the engine's stall check (RequestRunner.resend_stalled) finds at each of ``ticks`` (loop
    times: an injected clock) while the endpoints ``answering(now)`` names answer between ticks."""
    watch = PauseWatch(0.5, ticks[0])
    found = []
    for now in ticks[1:]:
        paused = watch.tick(now)
        if paused:
            pool.forgive(paused)
        found += [ep.url for ep in pool.find_stalled(now)]
        for i in answering(now):  # the answers read on this wake-up
            pool.endpoints[i].last_done = now
    return found


def test_a_paused_client_does_not_mark_healthy_endpoints_stalled() -> None:
    """`sglfleet generate` stopped (SIGSTOP) for 20 s, then continued: the loop's clock jumped 20 s
    while nobody could be heard; both endpoints answer again at once. None of them stalled."""
    before = [i * 0.5 for i in range(21)]  # 10 s of wake-ups every 0.5 s, both answering
    after = [30.5 + i * 0.5 for i in range(10)]  # SIGCONT after 20 s, then on time again
    pool = _busy_pool()
    # the last answers before the stop: a's at 9.5 s, b's at 10 s (one is always a little later)
    assert _run(pool, [*before, *after], lambda now: (1,) if now == 10.0 else (0, 1)) == []


def test_an_endpoint_that_stops_answering_is_still_found_stalled() -> None:
    ticks = [i * 0.5 for i in range(41)]  # 20 s, on time: endpoint b answers, endpoint a does not
    pool = _busy_pool()
    found = _run(pool, ticks, lambda _now: (1,))
    assert found and set(found) == {"http://a:1"}


# -- arguments, pipes, endpoints ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--grace", "nan"],
        ["generate", "--grace", "-5"],
        ["generate", "--grace", "inf"],
        ["generate", "--request-timeout", "nan"],
        ["generate", "--stall-min", "-1"],
        ["generate", "--metrics-linger", "nan"],
        ["health", "--count", "1", "--wait", "nan"],
        ["health", "--count", "1", "--interval", "0"],
        ["health", "--count", "1", "--timeout=-inf"],
    ],
)
def test_seconds_that_are_not_finite_or_negative_are_refused(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    if argv[0] == "generate":
        argv = [
            *argv,
            "-i",
            str(tmp_path / "in.jsonl"),
            "-o",
            str(tmp_path / "out.jsonl"),
            "-e",
            "http://h:1",
        ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "finite number" in err or "0 or more" in err or "positive" in err, err
    assert not (tmp_path / "out.jsonl").exists()


def test_the_engine_refuses_a_nan_or_negative_grace_given_as_a_config(tmp_path: Path) -> None:
    def problems(**kw: float) -> list[str]:
        inp = tmp_path / "in.jsonl"
        inp.write_text("{}\n")
        return check_config(
            GenerateConfig(input=inp, output=tmp_path / "o.jsonl", endpoints=["http://h:1"], **kw)
        )

    assert problems(grace=math.nan) == ["--grace nan is not a finite number"]
    assert problems(grace=-5.0) == ["--grace must be 0 or more"]
    assert problems(stall_min=math.inf) == ["--stall-min inf is not a finite number"]


def test_job_status_into_a_closed_pipe_prints_no_traceback(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 3)
    with latency_servers(1, 0.0, "ok") as urls:
        assert run_job(inp, out, urls).exit_code == ExitCode.OK
    for extra in ([], ["--json"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglfleet", "job", "status", str(out), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        proc.stdout.close()  # type: ignore[union-attr]  # the reader is gone before anything is written (| head)
        err = proc.stderr.read().decode()  # type: ignore[union-attr]
        assert proc.wait(timeout=30) == 128 + signal.SIGPIPE, err
        assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f"{shlex.quote(sys.executable)} -m sglfleet job status --json {shlex.quote(str(out))} | head -1",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout == "{\n" and "Traceback" not in shell.stderr, shell.stderr


def test_one_server_under_two_names_is_one_endpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 3)
    with latency_servers(1, 0.0, "ok") as urls:
        port = urls[0].rsplit(":", 1)[1]
        twice = ["-e", f"http://localhost:{port}", "-e", f"http://127.0.0.1:{port}"]
        assert main(["generate", "-i", str(inp), "-o", str(tmp_path / "o.jsonl"), *twice]) == 2
        err = capsys.readouterr().err
        assert f"endpoint 2: http://127.0.0.1:{port} is the same server as endpoint 1" in err, err
        assert get_json(urls[0] + "/attempts") == [], "nothing was sent"
    assert (
        check_config(
            GenerateConfig(
                input=inp, output=tmp_path / "o.jsonl", endpoints=["http://127.0.0.1:9", "http://[::1]:9"]
            )
        )
        == []
    ), "[::1] and 127.0.0.1 are two listeners"


# -- every `next:` line works when pasted ----------------------------------------------------------------


def test_exit_2_prints_no_next_line(tmp_path: Path) -> None:
    """docs/exit-codes.md: exit 2 is "fix what the message names"; its message names the choices."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 3)
    out.write_text("someone else's file\n")  # no manifest: not ours
    done = _cli("generate", "-i", str(inp), "-o", str(out), "-e", "http://127.0.0.1:9")
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert "use --force to resume into it, or another --output" in done.stderr
    assert "next:" not in done.stderr + done.stdout


def _cli(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-m", "sglfleet", *args], capture_output=True, text=True, check=False, **kw
    )


def _paste(stderr: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The `next:` line run as a user pastes it: by a shell, `sglfleet` found on the PATH."""
    line = next(x for x in stderr.splitlines() if x.startswith("next: ")).removeprefix("next: ")
    assert line.startswith("sglfleet "), line
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-c", line],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PATH": path, **(env or {})},
    )


def test_after_exit_3_the_next_line_works(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 10)
    with latency_servers(1, 0.0, "hostile_once") as urls:
        first = _cli("generate", "-i", str(inp), "-o", str(out), "-e", urls[0], "--max-retries", "0")
        assert first.returncode == ExitCode.FAILURES, first.stderr
        again = _paste(first.stderr)
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)


def test_after_exit_4_the_next_line_works_with_the_right_key(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 5)
    with fleet({"api_key": "right"}) as servers:
        first = _cli(
            "generate", "-i", str(inp), "-o", str(out), "-e", servers[0].base_url, "--api-key", "wrong"
        )
        assert first.returncode == ExitCode.AUTH, first.stderr
        assert "wrong" not in first.stderr.splitlines()[-1], "the key is left out of the next: line"
        again = _paste(first.stderr, {"SGLFLEET_API_KEY": "right"})
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)


def test_after_exit_5_the_next_line_works_once_the_fleet_answers(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 5)
    with fleet({}) as servers:
        server = servers[0]
        os.kill(server.process.pid, signal.SIGSTOP)  # a hung host
        try:
            first = _cli(
                "generate", "-i", str(inp), "-o", str(out), "-e", server.base_url, "--probe-timeout", "1"
            )
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert first.returncode == ExitCode.NO_ENDPOINT, first.stderr
        again = _paste(first.stderr)
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)


def test_after_exit_6_the_next_line_works(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 5)
    with latency_servers(1, 0.0, "ok") as urls:
        assert _cli("generate", "-i", str(inp), "-o", str(out), "-e", urls[0]).returncode == 0
        inp.write_text(inp.read_text().replace("prompt 4", "prompt 5"))
        first = _cli("generate", "-i", str(inp), "-o", str(out), "-e", urls[0])
        assert first.returncode == ExitCode.INPUT_CHANGED, first.stderr
        again = _paste(first.stderr)
    assert again.returncode == 0, again.stderr
    assert "--force" in again.args[2]


def test_after_exit_7_the_next_line_works_once_there_is_room(tmp_path: Path, small_disk: Path) -> None:
    inp, out = tmp_path / "in.jsonl", small_disk / "out.jsonl"
    ids = write_batch(inp, 400)
    with latency_servers(1, 0.0, "ok") as urls:
        first = _cli("generate", "-i", str(inp), "-o", str(out), "-e", urls[0])
        assert first.returncode == ExitCode.DISK_FULL, first.stderr
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
        again = _paste(first.stderr)
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)


def test_after_exit_130_the_next_line_works(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 200)
    with latency_servers(1, 0.05, "ok") as urls:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglfleet",
                "generate",
                "-i",
                str(inp),
                "-o",
                str(out),
                "-e",
                urls[0],
                "-c",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: count_lines(out) >= 3, timeout=30, what="3 results")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == ExitCode.INTERRUPTED, stderr
        again = _paste(stderr)
    assert again.returncode == 0, again.stderr
    assert_exactly_once(out, ids)
