"""The generation engine: a resumable, exactly-once batch job across every SGLang instance.

- `engine`: `run(GenerateConfig)`, the job itself (its stages in order), and its `ExitCode`s;
  `requests`: each request's lifecycle (retries, re-sends past a stalled endpoint, written once).
- `formats`: the input lines (OpenAI batch, chat, prompt) and the sampling parameters.
- `store` / `manifest`: the output and errors files, and the manifest (and its writer) that makes a
  rerun resume.
- `dispatch` / `client`: fewest-in-flight dispatch over endpoints, and the HTTP attempts.
- `progress`: what a running job prints; `metrics`: what `--metrics-port` serves.
- `watch`: `job_status(OUT)`, where a job stands, from another shell (`sglfleet job status`).
- `timeline`: `OUT.timeline.jsonl`, the job's samples over time (`sglfleet job report`).
- `unit`: a generation job as a transient systemd unit on a fleet host (what module `generation_job`
  drives).
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.gen._client import completion_problem
    from sglfleet.gen._config import GenerateConfig, GenParams
    from sglfleet.gen._config import from_args as job_config
    from sglfleet.gen._config import from_options as job_config_from_options
    from sglfleet.gen._config import module_argument_spec as job_module_spec
    from sglfleet.gen._config import settings as job_settings
    from sglfleet.gen._config import to_argv as job_argv
    from sglfleet.gen._engine import ExitCode, Outcome, check_config, run
    from sglfleet.gen._formats import InputFormat, iter_requests, scan_input
    from sglfleet.gen._manifest import Manifest, ManifestError, manifest_path
    from sglfleet.gen._manifest import load as load_manifest
    from sglfleet.gen._progress import LogReporter, Reporter, RichReporter, reporter_for
    from sglfleet.gen._store import OutputStore, StoreError, result_line
    from sglfleet.gen._timeline import MAX_SAMPLES as TIMELINE_MAX_SAMPLES
    from sglfleet.gen._timeline import TimelineWriter, timeline_path
    from sglfleet.gen._timeline import load as load_timeline
    from sglfleet.gen._unit import JobSpec
    from sglfleet.gen._unit import decide as decide_job
    from sglfleet.gen._unit import journal_tail as job_journal_tail
    from sglfleet.gen._unit import observe as observe_job
    from sglfleet.gen._unit import phase_status as job_phase_status
    from sglfleet.gen._unit import start as start_job
    from sglfleet.gen._unit import stop as stop_job
    from sglfleet.gen._unit import summary as job_summary
    from sglfleet.gen._unit import verdict as job_verdict
    from sglfleet.gen._unit import wait as wait_job
    from sglfleet.gen._unit import write_env as write_job_env
    from sglfleet.gen._watch import JobStatus, job_status

__getattr__, __dir__, __all__ = attach(__name__, __file__)
