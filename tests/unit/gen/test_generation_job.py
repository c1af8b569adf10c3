"""generation_job: the unit's command line runs a real job; the decisions over real manifests."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.generate import assert_exactly_once, fleet, write_conversations

from sglfleet.gen import _unit as job
from sglfleet.gen import load_manifest as load
from sglfleet.gen import manifest_path
from sglfleet.host import read_env_file

pytestmark = pytest.mark.timeout(60)


def _spec(tmp_path: Path, urls: list[str], **kw: object) -> job.JobSpec:
    options = {"name": "t1", "input": tmp_path / "in.jsonl", "output": tmp_path / "out.jsonl"}
    options.update({"endpoints": urls, "concurrency": 4, "max_tokens": 16, **kw})
    return job.JobSpec.from_options(options, env_dir=tmp_path / "run")


def _observe(spec: job.JobSpec, unit_state: str = "inactive") -> job.Observed:
    m = load(manifest_path(spec.output))
    return job.Observed(unit_state, "", None, m, job.file_sha256(spec.input) if m else None)


def test_the_units_command_runs_the_job_and_decisions_follow_its_manifest(tmp_path: Path) -> None:
    with fleet({}) as servers:
        spec = _spec(tmp_path, [servers[0].base_url], api_key="k3y")
        ids = write_conversations(spec.input, 40)
        assert job.decide(_observe(spec), "started") == job.Decision("start", "absent", "the job has not run")
        proc = subprocess.run(spec.command(), capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_exactly_once(spec.output, ids)
    assert "--max-tokens" in spec.command() and "k3y" not in " ".join(spec.command())

    obs = _observe(spec)
    assert job.decide(obs, "started").action == "none"
    assert job.decide(obs, "started").state == "complete"
    assert job.summary(obs)["counts"]["done"] == 40
    assert job.decide(_observe(spec, "active"), "started") == job.Decision(
        "none", "running", "the job is running"
    )
    assert job.decide(_observe(spec, "active"), "stopped").action == "stop"
    assert job.decide(obs, "stopped").action == "none"

    write_conversations(spec.input, 41)  # the input changed after completion
    assert job.decide(_observe(spec), "started").reason == "the input changed since the job completed"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> job.JobSpec:
    tmp = tmp_path_factory.mktemp("finished")
    with fleet({}) as servers:
        spec = _spec(tmp, [servers[0].base_url])
        write_conversations(spec.input, 3)
        subprocess.run(spec.command(), capture_output=True, timeout=30, check=True)
    return spec


@pytest.mark.parametrize(
    ("status", "retry", "action"),
    [
        ("interrupted", False, "start"),
        ("failed", False, "start"),
        ("running", False, "start"),  # the manifest says running but no unit is: it crashed
        ("complete_with_failures", False, "none"),
        ("complete_with_failures", True, "start"),
    ],
)
def test_stopped_failed_or_crashed_jobs_are_started_again(
    finished: job.JobSpec, status: str, retry: bool, action: str
) -> None:
    m = load(manifest_path(finished.output))
    assert m is not None
    obs = job.Observed(
        "failed", "exit-code", 1, m.model_copy(update={"status": status}), job.file_sha256(finished.input)
    )
    assert job.decide(obs, "started", retry_failures=retry).action == action


def test_env_file_holds_the_key_with_mode_0600(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ["http://127.0.0.1:1"], api_key="s3cret value")
    spec.env_dir.mkdir(mode=0o755)
    spec.env_file.write_text("old\n")
    spec.env_file.chmod(0o644)  # a file left world-readable before: made 0600 again
    job.write_env(spec)
    assert spec.env_file.read_text() == 'SGLFLEET_API_KEY="s3cret value"\n'
    assert read_env_file(spec.env_file).values == {"SGLFLEET_API_KEY": "s3cret value"}
    assert stat.S_IMODE(spec.env_file.stat().st_mode) == 0o600


def test_the_units_command_with_its_env_file_authenticates(tmp_path: Path) -> None:
    with fleet({"api_key": "k3y"}) as servers:
        spec = _spec(tmp_path, [servers[0].base_url], api_key="k3y")
        ids = write_conversations(spec.input, 10)
        job.write_env(spec)
        env = read_env_file(spec.env_file).values  # what systemd hands the unit's process
        proc = subprocess.run(
            spec.command(), capture_output=True, text=True, timeout=30, check=False, env={**os.environ, **env}
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_exactly_once(spec.output, ids)


@pytest.mark.parametrize(
    ("status", "failed", "max_failures", "expected"),
    [
        ("complete", 0, 0, (True, 0)),
        ("complete_with_failures", 3, 0, (False, 3)),
        ("complete_with_failures", 3, 3, (True, 3)),
        ("failed", 0, 10, (False, 4)),
        ("interrupted", 0, 0, (False, 130)),
    ],
)
def test_phase_done_only_when_complete_within_max_failures(
    finished: job.JobSpec, status: str, failed: int, max_failures: int, expected: tuple[bool, int]
) -> None:
    code = expected[1]
    m = load(manifest_path(finished.output))
    assert m is not None
    m = m.model_copy(update={"status": status, "counts": m.counts.model_copy(update={"failed": failed})})
    obs = job.Observed("inactive", "exit-code", code, m, None)
    assert job.verdict(obs, max_failures) == expected
    running = job.Observed("active", "", None, m, None)
    assert job.verdict(running, max_failures) == (False, None)


@pytest.mark.parametrize(
    ("phase_done", "check_mode", "status"),
    [(True, False, "done"), (True, True, "done"), (False, True, "pending"), (False, False, "failed")],
)
def test_the_phase_status_the_ledger_records(phase_done: bool, check_mode: bool, status: str) -> None:
    """Role generate records what the module returns: a job not done is pending in check mode (a job
    that would start has not ended yet), failed in a real run."""
    assert job.phase_status(phase_done, check_mode) == status


def test_wait_reports_each_polls_counts(finished: job.JobSpec) -> None:
    polls: list[dict] = []  # type: ignore[type-arg]

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        # no such unit on this machine: what `systemctl show` prints for an unknown unit
        return subprocess.CompletedProcess(argv, 0, "LoadState=not-found\nActiveState=inactive\n", "")

    obs = job.wait(finished, timeout=5, interval=0.01, runner=systemctl, on_poll=polls.append)
    assert not obs.running and len(polls) == 1
    assert polls[0]["state"] == "complete" and polls[0]["done"] == polls[0]["total"] == 3


def test_spec_problems() -> None:
    bad = job.JobSpec.from_options({"name": "../x", "input": "rel.jsonl", "output": "/o"}, max_failures=-1)
    problems = bad.problems()
    assert any("name '../x'" in p for p in problems) and any("absolute" in p for p in problems)
    assert any("max_failures must be 0 or more" in p for p in problems)


def test_the_unit_runs_every_option_the_cli_has(tmp_path: Path) -> None:
    """What `sglfleet generate` offers, the module offers too: all turns regenerated, the reasoning
    kept, extra body fields and chat template kwargs sent, top_k, the metrics served (and lingering)."""
    from sglfleet_testing.standin.process import free_port

    port = free_port()
    with fleet({"reasoning_parser": "qwen3", "standin_natural_tokens": "40:60"}) as servers:
        spec = _spec(
            tmp_path,
            [servers[0].base_url],
            max_tokens=200,
            turns="all",
            keep_reasoning=True,
            top_k=5,
            extra_body={"min_p": 0.05},
            chat_template_kwargs={"enable_thinking": True},
            metrics_port=port,
            metrics_linger=0.0,
        )
        ids = write_conversations(spec.input, 4)
        proc = subprocess.run(spec.command(), capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"metrics on http://127.0.0.1:{port}/metrics" in proc.stderr
    records = assert_exactly_once(spec.output, ids)
    for record in records:
        answers = [t for t in record["conversations"] if t["role"] == "assistant"]
        assert answers and all(t["reasoning_content"] for t in answers)
    m = load(manifest_path(spec.output))
    assert m is not None
    assert m.params["turns"] == "all" and m.params["keep_reasoning"] is True
    assert m.params["extra"] == {"min_p": 0.05, "top_k": 5, "chat_template_kwargs": {"enable_thinking": True}}
    assert job.JobSpec.from_options({"name": "x", "input": "/i", "output": "/o", "turns": "some"}).problems()


def test_the_units_command_serves_metrics_on_the_bind_address(tmp_path: Path) -> None:
    """Role generate's generate_metrics_port / generate_metrics_bind reach the unit as --metrics-port and
    --metrics-bind: the running job answers a scrape on that address (127.0.0.2: loopback, not 127.0.0.1)."""
    assert "--metrics-port" not in _spec(tmp_path, ["http://h:1"]).command()
    with fleet({"standin_ttft": 0.02, "max_running_requests": 2}) as servers:
        spec = _spec(
            tmp_path, [servers[0].base_url], metrics_port=0, metrics_bind="127.0.0.2", metrics_linger=0.0
        )
        command = spec.command()
        assert command[command.index("--metrics-port") + 1] == "0"
        assert command[command.index("--metrics-bind") + 1] == "127.0.0.2"
        write_conversations(spec.input, 200)
        proc = subprocess.Popen(spec.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            match = re.search(r"metrics on http://127\.0\.0\.2:(\d+)/metrics", line)
            assert match, line
            port = int(match.group(1))
            with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5) as resp:
                assert "sglfleet_generate_requests_total 200.0" in resp.read().decode()
            with pytest.raises(urllib.error.URLError):  # not on 127.0.0.1: only the address asked for
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
            assert proc.wait(60) == 0, proc.stderr.read()  # type: ignore[union-attr]
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "damage",
    [
        lambda out: out.unlink(),
        lambda out: out.write_bytes(b""),
        lambda out: out.write_bytes(out.read_bytes()[:-30]),  # a torn tail
    ],
    ids=["deleted", "emptied", "cut short"],
)
def test_a_complete_job_whose_results_are_gone_is_started_again(tmp_path: Path, damage) -> None:
    """The results on disk are the truth (issue 28): a manifest that says complete over an output that
    was deleted, emptied or cut short is not believed; the module starts the unit, which resumes."""
    with fleet({}) as servers:
        spec = _spec(tmp_path, [servers[0].base_url])
        write_conversations(spec.input, 3)
        subprocess.run(spec.command(), capture_output=True, timeout=30, check=True)

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "LoadState=not-found\nActiveState=inactive\n", "")

    whole = job.observe(spec, systemctl)
    assert job.decide(whole, "started").action == "none" and job.verdict(whole, 0) == (True, 0)
    damage(spec.output)
    obs = job.observe(spec, systemctl)
    decision = job.decide(obs, "started")
    assert decision.action == "start" and decision.state == "results_missing"
    assert decision.reason.startswith("results missing or short: rerun resumes")
    assert job.verdict(obs, 0)[0] is False
    assert job.summary(obs)["status"] == "results_missing"
