#!/usr/bin/python
# Copyright: sglfleet contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible module generation_job: a thin adapter over sglfleet.gen._unit."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: generation_job
short_description: Run a resumable sglfleet generation job as a transient systemd unit, idempotent by name
description:
  - Runs C(sglfleet generate) on the target as the transient systemd unit C(sglfleet-gen-<name>).
  - "Idempotent by I(name): a running job is left alone (C(changed=false), with its progress); a
    complete job is left alone (with its summary); a failed, stopped or never-started job is started
    (C(changed=true)) and resumes where it stopped: the output holds exactly one result per prompt
    whatever happened before."
  - A complete job whose input file changed since is started again (the engine then refuses it
    unless I(force), naming what changed).
  - "With I(wait) the module polls every I(poll_interval) seconds until the job ends or
    I(wait_timeout) passes: each poll's counts go to the target's log (journal, C(ansible-generation_job))
    and to C(progress) in the result. It fails unless the job ended complete with at most
    I(max_failures) permanent failures (C(phase_done)). To see progress on the controller while it
    runs, call the module without I(wait) under C(async)/C(poll) and then poll C(sglfleet job status)
    or re-run it (see EXAMPLES)."
  - "The job's exit codes (C(exit_code), C(sglfleet.exitcodes.ExitCode), the scheme of mix, merge and
    generate, docs/exit-codes.md): 0 complete; 3 complete with permanent failures; 2 bad input or
    arguments; 4 the API key is refused (401/403); 5 no endpoint answers; 6 the input changed since it
    was validated (I(force) goes on); 7 no space left on the output's disk; 1 other fatal error; 130
    interrupted. All but 0, 2 and 3 leave the job resumable: the next start resumes."
  - I(state=stopped) stops a running job gracefully (SIGTERM; in-flight requests get I(grace) seconds).
  - "The counts, tokens and throughput returned come from the job's C(OUT.manifest.json); the results
    file on disk is checked against it (the manifest records its size and a fingerprint): a complete
    job whose output was deleted, emptied or cut short reads C(results_missing) (results missing or
    short, rerun resumes) and is started again (it resumes)."
  - Needs systemd and the C(sglfleet) Python package on the target.
version_added: "0.1.0"
author:
  - sglfleet maintainers (@sglfleet)
options:
  name:
    description: Job name; the unit is C(sglfleet-gen-<name>.service).
    type: str
    required: true
  input:
    description: Absolute path of the prompts on the target (OpenAI Batch JSONL or conversation JSONL).
    type: path
    required: true
  output:
    description: Absolute path of the output (OpenAI Batch output JSONL) on the target.
    type: path
    required: true
  endpoints:
    description: Base URLs of the SGLang instances, e.g. C(http://10.0.0.5:30000). Needed to start.
    type: list
    elements: str
    default: []
  state:
    description: C(started) runs the job to completion (starting or resuming it); C(stopped) stops it.
    type: str
    choices: [started, stopped]
    default: started
  concurrency:
    description: Requests in flight per endpoint.
    type: int
    default: 32
  model:
    description: Model name, set in every request body (over the body's own; C(--model)).
    type: str
  max_tokens:
    description: max_tokens, set in every request body (over the body's own; C(--max-tokens)).
    type: int
  temperature:
    description: temperature, set in every request body (over the body's own; C(--temperature)).
    type: float
  top_p:
    description: top_p, set in every request body (over the body's own; C(--top-p)).
    type: float
  top_k:
    description: top_k, set in every request body (SGLang's extra sampling field; C(--top-k)).
    type: int
  extra_body:
    description: 'More request body fields, set in every body, e.g. C({"min_p": 0.05}) (C(--extra-body)).'
    type: dict
  chat_template_kwargs:
    description:
      - 'C(chat_template_kwargs) of every request body, e.g. C({"enable_thinking": true})
        (C(--chat-template-kwargs)).'
    type: dict
  turns:
    description:
      - Conversation input only (refused on OpenAI Batch input). C(last) regenerates the last assistant
        turn, C(all) every one in order, as SpecForge's C(regenerate_train_data.py) does (C(--turns)).
    type: str
    choices: [last, all]
    default: last
  keep_reasoning:
    description:
      - Keep each answer's C(reasoning_content) in its assistant turn of the conversation written with
        the result (SpecForge's C(--reasoning save)); chat requests of either input format
        (C(--keep-reasoning)).
    type: bool
    default: false
  max_resends:
    description: Times one request is sent to another endpoint because the one it waits on stalled.
    type: int
    default: 5
  dispatch:
    description:
      - C(prefix) sends a request to the endpoint that served its longest prompt prefix last while its
        load allows (SGLang's prefix cache then skips that prefill), else the least-loaded;
        C(least-loaded) goes by the requests in flight only (C(--dispatch)).
    type: str
    choices: [prefix, least-loaded]
    default: prefix
  backoff_base:
    description: Seconds before the first retry of a request; each next one waits longer (C(--backoff-base)).
    type: float
    default: 1
  down_timeout:
    description:
      - Seconds the job waits while no endpoint answers before it gives up, resumable
        (C(--down-timeout)).
    type: float
    default: 600
  start_timeout:
    description:
      - Seconds the job waits at its start while no endpoint is ready but one says not yet (a router
        with no healthy worker answers C(/readiness) 503; an instance starting); C(0) does not wait
        (C(--start-timeout)).
    type: float
    default: 120
  probe_timeout:
    description: Seconds the preflight waits for each endpoint's C(/health_generate) (C(--probe-timeout)).
    type: float
    default: 10
  stall_factor:
    description:
      - An endpoint that answers nothing for this many times its recent latency (and at least
        I(stall_min) seconds) is stalled; its requests are sent elsewhere too (C(--stall-factor)).
    type: float
    default: 8
  stall_min:
    description: The fewest seconds of silence that make an endpoint stalled (C(--stall-min)).
    type: float
    default: 2
  metrics_port:
    description:
      - Serve the job's Prometheus metrics on I(metrics_bind):PORT/metrics while it runs (C(0) any free
        port; C(--metrics-port)). Unset, none.
    type: int
  metrics_bind:
    description:
      - The address the metrics listen on (C(--metrics-bind)); C(0.0.0.0) lets a Prometheus on another
        host scrape them.
    type: str
    default: 127.0.0.1
  metrics_linger:
    description:
      - Seconds the metrics stay up after the job ends, with the final values and
        C(sglfleet_generate_exit_code), for the last scrape (C(--metrics-linger)).
    type: float
    default: 15
  max_retries:
    description: Retries of a request on connection errors, timeouts, 408, 429 and 5xx.
    type: int
    default: 5
  request_timeout:
    description: Seconds one attempt may take.
    type: float
    default: 600
  grace:
    description: Seconds in-flight requests get to finish when the job is stopped.
    type: float
    default: 30
  force:
    description: Continue an output whose manifest records another input or other parameters.
    type: bool
    default: false
  retry_failures:
    description: Start a job that completed with permanent failures again, to retry them.
    type: bool
    default: false
  max_failures:
    description:
      - Permanent failures the phase tolerates; C(phase_done) is true when the job is complete with at
        most this many. With I(wait), more fail the task.
    type: int
    default: 0
  api_key:
    description: SGLang API key; written to a mode 0600 environment file, never to the unit or the log.
    type: str
  wait:
    description: Poll until the job is no longer running (or I(wait_timeout) passes).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait with I(wait).
    type: float
    default: 86400
  poll_interval:
    description: Seconds between polls with I(wait).
    type: float
    default: 10
extends_documentation_fragment:
  - attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the job would be started or stopped, and does nothing.
  diff_mode:
    support: none
    details:
      - Starts or stops a job, which changes no configuration a diff could show.
notes:
  - To watch a job from another play or a shell without starting anything, run
    C(sglfleet job status OUTPUT --json) on the fleet host (exit 0 complete, 3 complete with failures,
    10 running, 11 stopped).
"""

EXAMPLES = r"""
- name: Read the ledger of every fleet host
  sglfleet.ops.fleet_ledger:
    state: read
  loop: "{{ groups['fleet'] }}"
  delegate_to: "{{ item }}"
  register: ledgers

- name: Find the endpoints phase fleet recorded
  sglfleet.ops.fleet_endpoints:
    ledgers: "{{ ledgers.results | items2dict(key_name='item', value_name='ledger') }}"
  register: fleet

- name: Run the regeneration job on the whole fleet and wait for it
  sglfleet.ops.generation_job:
    name: regen-2026-12
    input: /var/lib/sglfleet/prompts.jsonl
    output: /var/lib/sglfleet/regen.jsonl
    endpoints: "{{ fleet.endpoints }}"
    concurrency: 64
    model: Qwen/Qwen3-32B
    max_tokens: 2048
    temperature: 0.7
    api_key: "{{ sglang_fleet_api_key }}"
    wait: true
    wait_timeout: 86400
    max_failures: 10
  no_log: true

- name: Start it without blocking; Ansible polls the async task and prints each poll
  sglfleet.ops.generation_job:
    name: regen-2026-12
    input: /var/lib/sglfleet/prompts.jsonl
    output: /var/lib/sglfleet/regen.jsonl
    endpoints: ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    wait: true
    poll_interval: 60
  async: 86400
  poll: 60

- name: Stop it gracefully (a later run resumes)
  sglfleet.ops.generation_job:
    name: regen-2026-12
    input: /var/lib/sglfleet/prompts.jsonl
    output: /var/lib/sglfleet/regen.jsonl
    state: stopped
"""

RETURN = r"""
unit:
  description: The systemd unit of the job.
  returned: always
  type: str
  sample: sglfleet-gen-regen-2026-12.service
status:
  description: "The job: running, complete, complete_with_failures, interrupted, failed, results_missing
    (complete, but its output is not what the manifest summarised) or absent."
  returned: always
  type: str
state:
  description: The same as C(status).
  returned: always
  type: str
exit_code:
  description:
    - The job's last exit code, or null while it runs or when it never ran (C(sglfleet.gen.ExitCode)).
    - 0 complete; 3 complete with permanent failures; 2 bad input or arguments, nothing sent;
      4 the API key is refused (401/403); 5 no endpoint answers; 6 the input changed since it was
      validated; 7 no space left on the output's disk; 1 other fatal error; 130 interrupted.
    - All but 0, 2 and 3 leave the job resumable; the next start resumes it.
  returned: always
  type: int
phase_done:
  description: The job is complete and no more than I(max_failures) requests failed for good.
  returned: always
  type: bool
phase_status:
  description:
    - What the ledger records for phase generate (role generate's record step writes it as it is).
    - C(done) when I(phase_done); C(pending) in check mode otherwise (a job that would start has not
      ended yet); C(failed) otherwise.
  returned: always
  type: str
  sample: done
progress:
  description: With I(wait), the counts at each poll (at most the last 100).
  returned: when I(wait)
  type: list
  elements: dict
  sample: [{"at": "2026-12-03T08:00:00Z", "state": "running", "done": 1200, "failed": 0, "total": 193000,
            "requests_per_s": 41.2}]
action:
  description: "What the module did (or would do in check mode): none, start or stop."
  returned: always
  type: str
reason:
  description: Why.
  returned: always
  type: str
counts:
  description: From the manifest.
  returned: when the job has a manifest
  type: dict
  sample: {"total": 193000, "done": 192990, "failed": 10, "remaining": 0, "sent_this_run": 1200,
           "retries_this_run": 4}
tokens:
  description: Prompt and completion tokens over all runs.
  returned: when the job has a manifest
  type: dict
throughput:
  description: Requests/s and output tokens/s of the latest run.
  returned: when the job has a manifest
  type: dict
message:
  description: "The engine's last word, e.g. where the failures are listed."
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglfleet_deps import SGLFLEET

with SGLFLEET:
    from sglfleet.gen import (
        JobSpec,
        decide_job,
        job_journal_tail,
        job_phase_status,
        job_summary,
        job_verdict,
        observe_job,
        start_job,
        stop_job,
        wait_job,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "input": {"type": "path", "required": True},
            "output": {"type": "path", "required": True},
            "endpoints": {"type": "list", "elements": "str", "default": []},
            "state": {"type": "str", "choices": ["started", "stopped"], "default": "started"},
            "concurrency": {"type": "int", "default": 32},
            "model": {"type": "str"},
            "max_tokens": {"type": "int", "no_log": False},  # a count of tokens, not a secret
            "temperature": {"type": "float"},
            "top_p": {"type": "float"},
            "top_k": {"type": "int"},
            "extra_body": {"type": "dict"},
            "chat_template_kwargs": {"type": "dict"},
            "turns": {"type": "str", "choices": ["last", "all"], "default": "last"},
            "keep_reasoning": {"type": "bool", "default": False},
            "max_resends": {"type": "int", "default": 5},
            "dispatch": {"type": "str", "choices": ["prefix", "least-loaded"], "default": "prefix"},
            "backoff_base": {"type": "float", "default": 1},
            "down_timeout": {"type": "float", "default": 600},
            "start_timeout": {"type": "float", "default": 120},
            "probe_timeout": {"type": "float", "default": 10},
            "stall_factor": {"type": "float", "default": 8},
            "stall_min": {"type": "float", "default": 2},
            "metrics_port": {"type": "int"},
            "metrics_bind": {"type": "str", "default": "127.0.0.1"},
            "metrics_linger": {"type": "float", "default": 15},
            "max_retries": {"type": "int", "default": 5},
            "request_timeout": {"type": "float", "default": 600},
            "grace": {"type": "float", "default": 30},
            "force": {"type": "bool", "default": False},
            "retry_failures": {"type": "bool", "default": False},
            "max_failures": {"type": "int", "default": 0},
            "api_key": {"type": "str", "no_log": True},
            "wait": {"type": "bool", "default": False},
            "wait_timeout": {"type": "float", "default": 86400},
            "poll_interval": {"type": "float", "default": 10},
        },
        supports_check_mode=True,
    )
    SGLFLEET.require(module)
    p = module.params
    spec = JobSpec.from_options(p, max_failures=p["max_failures"])
    problems = spec.problems()
    if problems:
        module.fail_json(msg="; ".join(problems))
    try:
        obs = observe_job(spec)
        decision = decide_job(obs, p["state"], p["retry_failures"])
        if decision.action == "start" and not spec.endpoints:
            module.fail_json(msg=f"{decision.reason}, but no endpoints were given")
        if decision.action == "start" and not spec.input.is_file():
            module.fail_json(msg=f"input {spec.input} is not a file on the target")
        changed = decision.action != "none"
        if changed and not module.check_mode:
            (start_job if decision.action == "start" else stop_job)(spec)
            obs = observe_job(spec)
        waiting = p["wait"] and p["state"] == "started" and not module.check_mode
        progress: list[dict] = []

        def on_poll(counts: dict) -> None:
            progress.append(counts)
            del progress[:-100]
            module.log(
                f"generation job {spec.name}: {counts['state']} {counts['done']}/{counts['total']} done, "
                f"{counts['failed']} failed, {counts['requests_per_s']} req/s"
            )

        if waiting:
            obs = wait_job(spec, p["wait_timeout"], p["poll_interval"], on_poll=on_poll)
    except RuntimeError as exc:
        module.fail_json(msg=str(exc))
    phase_done, exit_code = job_verdict(obs, spec.max_failures)
    result = {"changed": changed, "unit": spec.unit, "action": decision.action, "reason": decision.reason}
    result.update(job_summary(obs))
    result.update(
        phase_done=phase_done,
        phase_status=job_phase_status(phase_done, module.check_mode),
        exit_code=exit_code,
    )
    if waiting:
        result["progress"] = progress
        if obs.running:
            module.fail_json(msg=f"the job is still running after {p['wait_timeout']} s", **result)
        if not phase_done:
            failed = result.get("counts", {}).get("failed", 0)
            why = (
                f"{failed} permanent failures, more than max_failures={spec.max_failures}"
                if result["status"] == "complete_with_failures"
                else (result.get("message") or job_journal_tail(spec))
            )
            module.fail_json(msg=f"the job ended {result['status']} (exit {exit_code}): {why}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
