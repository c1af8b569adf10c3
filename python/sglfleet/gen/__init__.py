"""The generation engine: a resumable, exactly-once batch job across every SGLang instance.

- `engine`: `run(GenerateConfig)`, the job itself (its stages in order), and its `ExitCode`s;
  `requests`: each request's lifecycle (retries, re-sends past a stalled endpoint, written once).
- `formats`: the input lines (OpenAI batch, chat, prompt) and the sampling parameters.
- `store` / `manifest`: the output and errors files, and the manifest (and its writer) that makes a
  rerun resume.
- `dispatch` / `client`: fewest-in-flight dispatch over endpoints, and the HTTP attempts.
- `progress`: what a running job prints; `metrics`: what `--metrics-port` serves.
- `watch`: `job_status(OUT)`, where a job stands, from another shell (`sglfleet job status`).
- `unit`: a generation job as a transient systemd unit on a fleet host (what module `generation_job`
  drives).
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import exports

if TYPE_CHECKING:
    from sglfleet.gen._engine import ExitCode, GenerateConfig, Outcome, check_config, run
    from sglfleet.gen._formats import GenParams, InputFormat
    from sglfleet.gen._manifest import Manifest, ManifestError
    from sglfleet.gen._progress import Reporter, reporter_for
    from sglfleet.gen._watch import JobStatus, job_status

# Each name's submodule is imported when the name is first used (sglfleet._lazy).
_EXPORTS = {
    "ExitCode": "_engine",
    "GenerateConfig": "_engine",
    "Outcome": "_engine",
    "check_config": "_engine",
    "run": "_engine",
    "GenParams": "_formats",
    "InputFormat": "_formats",
    "Manifest": "_manifest",
    "ManifestError": "_manifest",
    "Reporter": "_progress",
    "reporter_for": "_progress",
    "JobStatus": "_watch",
    "job_status": "_watch",
}

__all__ = [
    "ExitCode",
    "GenParams",
    "GenerateConfig",
    "InputFormat",
    "JobStatus",
    "Manifest",
    "ManifestError",
    "Outcome",
    "Reporter",
    "check_config",
    "job_status",
    "reporter_for",
    "run",
]

__getattr__ = exports(__name__, _EXPORTS)
