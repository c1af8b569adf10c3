"""A generation job as a transient systemd unit (``sglfleet-gen-<name>``), idempotent by name.

What the ``generation_job`` Ansible module does, kept here so it can be tested without Ansible:

* :func:`observe` reads the unit's state (``systemctl show``) and the job's manifest;
* :func:`decide` says what to do about it: a running job is left alone (progress reported); a
  complete one too (its summary), unless its results on disk are not what its manifest summarised
  (deleted, emptied, cut short: then it is started, and resumes); a failed, stopped or
  never-started one is started, and resumes where it stopped (the engine's exactly-once output
  guarantees that);
* :func:`start` / :func:`stop` act; :func:`wait` polls until the unit is no longer active,
  calling back with the counts at every poll (the module logs them and returns them as ``progress``);
* :func:`verdict` says whether the phase is done: the job complete, with at most ``max_failures``
  permanent failures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sglfleet import atomicio, host
from sglfleet.gen import _manifest as manifest_mod
from sglfleet.gen._config import GenerateConfig, to_argv
from sglfleet.gen._config import from_options as config_from_options
from sglfleet.gen._manifest import Manifest
from sglfleet.records import results_problem

__all__ = [
    "JobSpec",
    "decide",
    "journal_tail",
    "observe",
    "phase_status",
    "start",
    "stop",
    "summary",
    "verdict",
    "wait",
    "write_env",
]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ACTIVE_STATES = frozenset({"active", "activating", "deactivating", "reloading"})
COMPLETE = frozenset({"complete", "complete_with_failures"})


@dataclasses.dataclass
class JobSpec:
    """A job as a unit: its name, its settings (:class:`GenerateConfig`, the one definition of them),
    what the phase tolerates, and where the unit's environment file and python are."""

    name: str
    config: GenerateConfig
    max_failures: int = 0  # permanent failures the phase tolerates (the job's exit code 3 either way)
    env_dir: Path = Path("/run/sglfleet")
    python: str = sys.executable

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **kw: Any) -> JobSpec:
        """The spec of the module's parameters (or any mapping of setting names to values: a setting
        missing or None takes its default); ``name`` from them, ``kw`` the rest of the spec's fields."""
        return cls(name=options["name"], config=config_from_options(options), **kw)

    @property
    def input(self) -> Path:
        return self.config.input

    @property
    def output(self) -> Path:
        return self.config.output

    @property
    def endpoints(self) -> list[str]:
        return self.config.endpoints

    @property
    def api_key(self) -> str | None:
        return self.config.api_key

    @property
    def grace(self) -> float:
        return self.config.grace

    @property
    def unit(self) -> str:
        return f"sglfleet-gen-{self.name}.service"

    @property
    def env_file(self) -> Path:
        return self.env_dir / f"gen-{self.name}.env"

    def problems(self) -> list[str]:
        out = []
        if not NAME_RE.match(self.name):
            out.append(f"name {self.name!r} must be 1-64 of [A-Za-z0-9_.-], starting with a letter or digit")
        if not self.input.is_absolute() or not self.output.is_absolute():
            out.append("input and output must be absolute paths")
        if self.max_failures < 0:
            out.append(f"max_failures must be 0 or more, got {self.max_failures}")
        turns = self.config.params.turns
        if turns not in ("last", "all"):
            out.append(f"turns must be last or all, got {turns!r}")
        port = self.config.metrics_port
        if port is not None and not 0 <= port <= 65535:
            out.append(f"metrics_port {port} is not a TCP port (0-65535)")
        return out

    def command(self) -> list[str]:
        """The ``sglfleet generate`` command line the unit runs (the API key travels in the env file)."""
        return [self.python, "-m", "sglfleet", "generate", *to_argv(self.config)]


@dataclasses.dataclass
class Observed:
    unit_state: str  # systemd ActiveState, "inactive" when the unit is not loaded
    unit_result: str  # systemd Result ("success", "exit-code", "signal", ...)
    exit_status: int | None
    manifest: Manifest | None
    input_sha256: str | None  # of the input as it is now (only computed when the manifest says complete)
    results_problem: str | None = None  # the output is not what a complete manifest summarised

    @property
    def running(self) -> bool:
        return self.unit_state in ACTIVE_STATES


@dataclasses.dataclass
class Decision:
    action: str  # "none", "start", "stop"
    state: str  # what the job is: running, complete, complete_with_failures, failed, interrupted, absent, ...
    reason: str


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def observe(spec: JobSpec, runner: Runner = host.run) -> Observed:
    props = _show(spec.unit, runner)
    status = props.get("ExecMainStatus")
    m = manifest_mod.load(manifest_mod.manifest_path(spec.output))
    sha = problem = None
    if m is not None and m.status in COMPLETE:
        if spec.input.is_file():
            sha = file_sha256(spec.input)
        problem = results_problem(spec.output, m.results, m.counts.done)
    return Observed(
        unit_state=props.get("ActiveState", "inactive")
        if props.get("LoadState") != "not-found"
        else "inactive",
        unit_result=props.get("Result", ""),
        exit_status=int(status) if status and status.isdigit() else None,
        manifest=m,
        input_sha256=sha,
        results_problem=problem,
    )


def _show(unit: str, runner: Runner) -> dict[str, str]:
    return host.show_checked(
        unit, ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus"), runner
    )


def decide(obs: Observed, wanted: str, retry_failures: bool = False) -> Decision:
    """What to do, given what is observed and the wanted state (``started`` or ``stopped``)."""
    m = obs.manifest
    if wanted == "stopped":
        if obs.running:
            return Decision("stop", "running", "the job is running: stop it (it stays resumable)")
        return Decision("none", m.status if m else "absent", "the job is not running")
    if obs.running:
        return Decision("none", "running", "the job is running")
    if m is not None and m.status in COMPLETE:
        if obs.input_sha256 is not None and obs.input_sha256 != m.input.sha256:
            return Decision("start", m.status, "the input changed since the job completed")
        if obs.results_problem is not None:  # the results on disk are the truth
            return Decision("start", "results_missing", obs.results_problem)
        if m.status == "complete_with_failures" and retry_failures:
            return Decision("start", m.status, "retrying the permanent failures")
        return Decision("none", m.status, "the job is complete")
    if m is None:
        return Decision("start", "absent", "the job has not run")
    return Decision("start", m.status, f"the job is {m.status}: start it again, it resumes")


API_KEY_ENV = "SGLFLEET_API_KEY"  # what `sglfleet generate` reads (sglfleet.cli._common)


def write_env(spec: JobSpec) -> None:
    """The unit's environment file (mode 0600, whatever existed before: it replaces the file, and is
    0600 from its birth): the API key stays out of unit properties and argv."""
    spec.env_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = f"{API_KEY_ENV}={host.quote(spec.api_key)}\n" if spec.api_key else ""
    atomicio.write_text(spec.env_file, text, mode=0o600)


def start(spec: JobSpec, runner: Runner = host.run) -> None:
    write_env(spec)
    runner(["systemctl", "reset-failed", spec.unit])  # a failed transient unit keeps its name taken
    argv = [
        "systemd-run",
        f"--unit={spec.unit}",
        f"--description=sglfleet generate {spec.name}",
        "--property=KillSignal=SIGTERM",
        f"--property=TimeoutStopSec={int(spec.grace) + 30}",
        "--property=SuccessExitStatus=3",
        f"--property=EnvironmentFile={spec.env_file}",
        "--setenv=PYTHONUNBUFFERED=1",
        *spec.command(),
    ]
    proc = runner(argv)
    if proc.returncode != 0:
        raise RuntimeError(f"systemd-run failed: {proc.stderr.strip() or proc.stdout.strip()}")


def stop(spec: JobSpec, runner: Runner = host.run) -> None:
    proc = runner(["systemctl", "stop", spec.unit])
    if proc.returncode != 0:
        raise RuntimeError(f"systemctl stop {spec.unit} failed: {proc.stderr.strip()}")


def progress_of(obs: Observed) -> dict[str, Any]:
    """One poll's counts: what the module logs and returns in ``progress``."""
    m = obs.manifest
    counts = m.counts if m is not None else None
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "state": "running" if obs.running else (m.status if m else "absent"),
        "done": counts.done if counts else 0,
        "failed": counts.failed if counts else 0,
        "total": counts.total if counts else 0,
        "requests_per_s": m.throughput.requests_per_s if m else 0.0,
    }


def wait(
    spec: JobSpec,
    timeout: float,
    interval: float = 5.0,
    runner: Runner = host.run,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> Observed:
    """Poll until the unit is no longer active or ``timeout`` seconds passed; the last observation.
    ``on_poll`` gets each poll's counts (:func:`progress_of`)."""
    deadline = time.monotonic() + timeout
    while True:
        obs = observe(spec, runner)
        if on_poll is not None:
            on_poll(progress_of(obs))
        if not obs.running or time.monotonic() >= deadline:
            return obs
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def verdict(obs: Observed, max_failures: int) -> tuple[bool, int | None]:
    """(phase_done, the job's exit code): done when the job is complete and no more than
    ``max_failures`` requests failed for good."""
    m = obs.manifest
    code = obs.exit_status
    if m is None or obs.running or obs.results_problem is not None:
        return False, code
    if m.status == "complete":
        return True, 0 if code is None else code
    if m.status == "complete_with_failures":
        return m.counts.failed <= max_failures, 3 if code is None else code
    return False, code


def phase_status(phase_done: bool, check_mode: bool = False) -> str:
    """The ledger status of phase generate for a job that was waited for: done (`verdict`'s
    phase_done), pending in check mode (a job that would start or restart has not ended yet), failed
    otherwise."""
    if phase_done:
        return "done"
    return "pending" if check_mode else "failed"


def journal_tail(spec: JobSpec, lines: int = 20, runner: Runner = host.run) -> str:
    proc = runner(["journalctl", "--unit", spec.unit, "--no-pager", "--output=cat", "-n", str(lines)])
    return proc.stdout.strip()


def summary(obs: Observed) -> dict[str, Any]:
    """The module's return values: counts, tokens, throughput, status, from the manifest."""
    m = obs.manifest
    if m is None:
        return {"status": "absent", "counts": {}, "tokens": {}, "throughput": {}, "message": ""}
    state = "running" if obs.running else "results_missing" if obs.results_problem else m.status
    return {
        "status": state,
        "state": state,
        "counts": m.counts.model_dump(),
        "tokens": m.tokens.model_dump(),
        "throughput": m.throughput.model_dump(),
        "message": obs.results_problem or m.message,
        "timings": m.timings.model_dump(),
    }
