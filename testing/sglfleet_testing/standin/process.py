"""Start a stand-in server as a subprocess on a free loopback port (for tests and benchmarks).

    with running_standin(max_running_requests=2, standin_ttft=0.1) as base_url:
        httpx.get(f"{base_url}/health")

Keyword flags map to command-line flags: `standin_ttft=0.1` -> `--standin-ttft 0.1`, `True` -> the
bare flag, `False`/`None` -> omitted. `model_path` defaults to "standin/model". Two of SGLang's
durations default shorter here than in the stand-in's CLI, so that tests do not wait for them
needlessly: the health check (`standin_health_seconds`, 0 here, 1 s in SGLang) and the drain's
poll after SIGTERM (`standin_drain_poll_seconds`, 0.1 s here, 5 s in SGLang).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

HOST = "127.0.0.1"


class StandinStartError(RuntimeError):
    """The stand-in exited or did not listen in time; the message carries its output."""


def free_port(host: str = HOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def standin_argv(port: int, **flags: Any) -> list[str]:
    """The command line of a stand-in with `flags` (see the module docstring)."""
    flags.setdefault("model_path", "standin/model")
    flags.setdefault("host", HOST)
    flags.setdefault("standin_health_seconds", 0.0)
    flags.setdefault("standin_drain_poll_seconds", 0.1)
    argv = [sys.executable, "-m", "sglfleet_testing.standin", "--port", str(port)]
    for key, value in flags.items():
        if value is None or value is False:
            continue
        option = "--" + key.replace("_", "-")
        argv += [option] if value is True else [option, str(value)]
    return argv


@dataclasses.dataclass
class StandinProcess:
    process: subprocess.Popen[bytes]
    base_url: str
    port: int
    log: Any  # a temporary file holding the server's stdout and stderr

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait for the drain, SIGKILL if it outlives `timeout`; the exit code (a drain
        that completed ends, as in SGLang, in the server's SIGKILL of itself: -9)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def output(self) -> str:
        """The server's stdout and stderr so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self) -> None:
        self.terminate()
        self.log.close()


def _listening(port: int, host: str) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_standin(*, wait_healthy: bool = True, timeout: float = 15.0, **flags: Any) -> StandinProcess:
    """Start a stand-in; return once it listens (and, with `wait_healthy`, once /health is 200)."""
    host = flags.get("host", HOST)
    for _attempt in range(3):
        port = free_port(host)
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by StandinProcess.close)
        process = subprocess.Popen(
            standin_argv(port, **flags),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        server = StandinProcess(process, f"http://{host}:{port}", port, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if _listening(port, host) and (not wait_healthy or _healthy(server.base_url)):
                return server
            time.sleep(0.02)
        else:
            server.terminate(1)
            output = server.output()
            server.log.close()
            raise StandinStartError(f"stand-in not ready within {timeout}s: {output}")
        output = server.output()
        server.log.close()
        if "address already in use" not in output.lower():
            raise StandinStartError(f"stand-in exited with {process.returncode}: {output}")
    raise StandinStartError("no free port after 3 attempts")


@contextlib.contextmanager
def standin_process(**flags: Any) -> Iterator[StandinProcess]:
    """A started stand-in (see `start_standin`), terminated on exit."""
    server = start_standin(**flags)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def running_standin(**flags: Any) -> Iterator[str]:
    """The base URL of a started, healthy stand-in, stopped on exit."""
    with standin_process(**flags) as server:
        yield server.base_url
