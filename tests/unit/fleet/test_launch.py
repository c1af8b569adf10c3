"""sglfleet.launch: the API key reaches the server in-process only, never a command line or the log,
and a normal stop (SGLang's drain, which ends in SIGKILL of itself) exits 0. Real processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sglfleet_testing.standin.process import free_port
from support.polling import wait_until

from sglfleet.launch import KEY_VARIABLE, REDACTED, keys_in_argv, protect_log, redact

pytestmark = pytest.mark.timeout(60)

KEY = "sk-fleet-0123456789abcdef"


def test_redact_replaces_the_key_and_any_quoted_api_key_value():
    line = "server_args=ServerArgs(model_path='m', api_key='other', admin_api_key=\"x\\\"y\", port=1)"
    assert redact(line) == (
        f"server_args=ServerArgs(model_path='m', api_key='{REDACTED}', admin_api_key='{REDACTED}', port=1)"
    )
    assert redact(f"Bearer {KEY} failed", [KEY]) == f"Bearer {REDACTED} failed"
    assert redact("api_key=None") == "api_key=None"


def test_protect_log_survives_a_forced_basic_config(tmp_path):
    previous = logging.getLogRecordFactory()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        protect_log([KEY])
        # what SGLang does twice (server_args.py:7750-7755, utils/common.py:1266): new root handlers
        logging.basicConfig(filename=tmp_path / "log", force=True, level=logging.INFO)
        logging.getLogger("sglang.srt.entrypoints.engine").info("server_args=ServerArgs(api_key=%r)", KEY)
        logging.getLogger("x").warning("key %s", KEY)
        logging.basicConfig(filename=tmp_path / "log", force=True)  # closes and flushes
        text = (tmp_path / "log").read_text()
        assert KEY not in text
        assert f"api_key='{REDACTED}'" in text
    finally:
        logging.setLogRecordFactory(previous)
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        root.handlers[:], root.level = handlers, level


def _launch(*args: str, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen[bytes]:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as out:
        command = [sys.executable, "-m", "sglfleet.launch", *args]
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment)


def _standin_args(port: int) -> list[str]:
    return [
        "sglfleet_testing.standin", "--model-path", "m", "--port", str(port),
        "--standin-health-seconds", "0", "--standin-drain-poll-seconds", "0.1",
    ]  # fmt: skip


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    def healthy() -> bool:
        assert process.poll() is None, "the launcher exited"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout=20, what=f"{url}/health answers 200", interval=0.05)


def _tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for c in children for p in _tree(int(c)))]


def test_the_key_is_on_no_command_line_and_in_no_log_line_and_is_required(tmp_path):
    port, log = free_port(), tmp_path / "out.log"
    process = _launch(*_standin_args(port), env={KEY_VARIABLE: KEY}, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        pids = _tree(process.pid)
        assert len(pids) == 2  # the supervisor and the server
        for pid in pids:
            assert KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0  # the drain ends in SGLang's SIGKILL of itself: a clean stop
    finally:
        process.kill()
        process.wait()
    output = log.read_text()
    assert KEY not in output
    assert f"api_key='{REDACTED}'" in output
    # SGLang registers the handler with loop.add_signal_handler (tokenizer_manager.py:1635), which calls it
    # with no arguments: its f-string prints the defaults.
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in output


def test_without_a_key_the_server_needs_none(tmp_path):
    port, log = free_port(), tmp_path / "out.log"
    process = _launch(*_standin_args(port), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        assert httpx.get(f"{url}/v1/models").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    assert "api_key=None" in log.read_text()


@contextlib.contextmanager
def _healthy_server(log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A launcher and its stand-in server, answering /health: (the launcher, the server's pid)."""
    port = free_port()
    process = _launch(*_standin_args(port), log=log)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", process)
        yield process, _tree(process.pid)[1]
    finally:
        process.kill()
        process.wait()


def test_a_server_that_dies_unasked_is_a_failure(tmp_path):
    with _healthy_server(tmp_path / "out.log") as (process, server):
        os.kill(server, signal.SIGKILL)  # as SGLang does itself when its scheduler dies
        assert process.wait(10) == 128 + signal.SIGKILL


def test_a_launcher_killed_from_outside_takes_its_server_with_it(tmp_path):
    """kill -9 of the unit's MainPID (the launcher) must not orphan the server: systemd then restarts."""
    with _healthy_server(tmp_path / "out.log") as (process, server):
        process.kill()
        process.wait(10)
        wait_until(
            lambda: not Path(f"/proc/{server}").exists() or _state(server) == "Z",
            timeout=10,
            what="the server outlived its launcher",
            interval=0.05,
        )


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


def test_the_server_modules_exit_code_is_the_launchers(tmp_path):
    process = _launch("sglfleet_testing.standin", "--no-such-flag", log=tmp_path / "out.log")
    assert process.wait(30) == 2
    assert "the following arguments are required: --model-path" in (tmp_path / "out.log").read_text()


@pytest.mark.parametrize("flag", ["--api-key", "--api-key=x", "--admin-api-key"])
def test_a_key_on_the_command_line_is_refused(tmp_path, flag):
    process = _launch("sglfleet_testing.standin", "--model-path", "m", flag, "x", log=tmp_path / "out.log")
    assert process.wait(30) == 2
    assert "SGLANG_FLEET_API_KEY" in (tmp_path / "out.log").read_text()


def test_no_module_prints_usage(tmp_path):
    process = _launch(log=tmp_path / "out.log")
    assert process.wait(30) == 2
    assert "usage: python -m sglfleet.launch MODULE" in (tmp_path / "out.log").read_text()


def test_spawned_children_log_redacted_too(tmp_path):
    """SGLang's scheduler and detokenizer are multiprocessing spawn children (engine.py:1305): they
    re-import the main module (this launcher) as __mp_main__, which protects their log as well."""
    (tmp_path / "spawnee.py").write_text(
        textwrap.dedent(
            """
            import logging, os

            def child(text):
                import sys
                logging.basicConfig(format="[child] %(message)s", force=True, level=logging.INFO)
                logging.getLogger("sglang.srt.managers.scheduler").info(text)
                print("child env has key:", "SGLANG_FLEET_API_KEY" in os.environ, flush=True)
                # the spawn pipe carried the parent's argv, key included: the bare key is redacted too
                print("child argv has key:", "--api-key" in sys.argv, flush=True)
                key = sys.argv[sys.argv.index("--api-key") + 1]
                logging.getLogger("sglang.srt.managers.scheduler").info("bare %s, in a URL x?k=%s&", key, key)
            """
        )
    )
    (tmp_path / "spawner.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, sys
            from spawnee import child

            if __name__ == "__main__":
                key = sys.argv[sys.argv.index("--api-key") + 1]
                ctx = multiprocessing.get_context("spawn")
                text = f"Global server args updated! ServerArgs(api_key={key!r})"
                p = ctx.Process(target=child, args=(text,))
                p.start()
                p.join()
                sys.exit(p.exitcode)
            """
        )
    )
    log = tmp_path / "out.log"
    env = {KEY_VARIABLE: KEY, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = _launch("spawner", log=log, env=env)
    assert process.wait(30) == 0, log.read_text()
    output = log.read_text()
    assert f"[child] Global server args updated! ServerArgs(api_key='{REDACTED}')" in output
    assert "child env has key: False" in output
    assert "child argv has key: True" in output
    assert f"[child] bare {REDACTED}, in a URL x?k={REDACTED}&" in output
    assert KEY not in output


def test_a_hung_server_kills_itself_after_the_watchdog_timeout_and_the_launcher_reports_a_crash(tmp_path):
    """SGLang 0.5.12's scheduler watchdog (sglang/srt/utils/watchdog.py:133-163): a forward batch stalled
    longer than --watchdog-timeout → error line, 5 s, SIGQUIT to the main process, which SIGKILLs itself
    (tokenizer_manager.py:2808-2817). Under the launcher that is exit 137: Restart=on-failure restarts it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    args = [*_standin_args(port), "--watchdog-timeout", "1", "--standin-hang-after", "2"]
    process = _launch(*args, env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}, log=log)
    try:
        _wait_healthy(url, process)
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
        # The first request's prefill and its decode are the two forward batches; then the loop stops.
        assert httpx.post(f"{url}/generate", json=body, timeout=5).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/generate", json=body, timeout=1)
        # HTTP still accepts, but the 1-token check never comes back: 503, as SGLang's health_generate.
        assert httpx.get(f"{url}/health_generate", timeout=5).status_code == 503
        # The request that hung has hung up, but its batch stays stuck in the forward loop (the scheduler
        # would handle the abort only after that forward): the watchdog still sees a busy scheduler.
        # the timeout (1 s) at a look every 0.5 s, then 5 s for the parent to print, then SIGQUIT: that
        # timing is test_standin_watchdog's, on a fake clock; here the end of it, in order
        assert process.wait(timeout=30) == 128 + signal.SIGKILL
        text = log.read_text()
        timeout = text.index("Scheduler watchdog timeout (self.watchdog_timeout=1.0, self.soft=False)")
        assert (
            text.index("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
            > timeout
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("argv", "keys"),
    [
        (["m", "--port", "1", "--api-key", "k1"], ["k1"]),
        (["m", "--api-key=k1", "--admin-api-key", "k2"], ["k1", "k2"]),
        (["m", "--api-key"], []),
        (["m", "--api-keys", "x", "--port", "1"], []),
    ],
)
def test_keys_in_argv_finds_each_spelling(argv, keys):
    assert keys_in_argv(argv) == keys
