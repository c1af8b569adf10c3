"""Each setting of a generation job is defined once (sglfleet.gen._config): the command line's
arguments, the systemd unit's argv, the module generation_job's options and role generate's defaults
all say what the settings model says, and a config survives the trip through the unit's argv."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglfleet.cli import build_parser
from sglfleet.gen import (
    GenerateConfig,
    GenParams,
    JobSpec,
    job_argv,
    job_config,
    job_module_spec,
    job_settings,
)
from sglfleet.gen import job_config_from_options as job_config_of

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = job_settings()

# A value other than the default for every setting (a new setting must say its own here).
OTHER: dict[str, Any] = {
    "input": Path("/data/in put.jsonl"),
    "output": Path("/data/out.jsonl"),
    "endpoints": ["http://10.0.0.5:30000", "http://10.0.0.6:30000"],
    "concurrency": 7,
    "dispatch": "least-loaded",
    "model": "Qwen/Qwen3-8B",
    "max_tokens": 64,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 20,
    "chat_template_kwargs": {"enable_thinking": False},
    "extra_body": {"min_p": 0.05, "stop": ["</s>"]},
    "turns": "all",
    "keep_reasoning": True,
    "max_retries": 0,
    "request_timeout": 12.5,
    "backoff_base": 0.25,
    "grace": 0.0,
    "down_timeout": 30.0,
    "start_timeout": 0.0,
    "probe_timeout": 3.0,
    "stall_factor": 4.0,
    "stall_min": 0.5,
    "max_resends": 1,
    "metrics_port": 0,
    "metrics_bind": "0.0.0.0",
    "metrics_linger": 0.0,
    "api_key": "s3cret",
    "force": True,
}
# The module's own options: what the phase does with the job, not how the job runs.
MODULE_ONLY = {"name", "state", "retry_failures", "max_failures", "wait", "wait_timeout", "poll_interval"}
# Role defaults that differ from the command's on purpose (the role's choice, said in its defaults file).
ROLE_CHOICES = {"max_tokens": 2048, "model": "", "input": None, "output": None, "api_key": None}


def _round_trip(config: GenerateConfig) -> GenerateConfig:
    """The config the unit's command line gives: parsed as `sglfleet generate` parses it (the API key
    travels in the environment, not in argv)."""
    argv = JobSpec(name="j", config=config).command()[3:]
    assert argv[0] == "generate"
    return job_config(build_parser().parse_args(argv), api_key=config.api_key)


def test_every_setting_has_a_value_to_test_with() -> None:
    assert set(OTHER) == {s.name for s in SETTINGS}
    for s in SETTINGS:
        assert OTHER[s.name] != s.default, s.name


@pytest.mark.parametrize("name", [s.name for s in SETTINGS if not s.required])
def test_each_setting_survives_the_units_command_line(name: str) -> None:
    base = {"input": OTHER["input"], "output": OTHER["output"]}
    config = job_config_of({**base, name: OTHER[name]})
    assert config != job_config_of(base), f"{name} changed nothing"
    assert _round_trip(config) == config
    setting = next(s for s in SETTINGS if s.name == name)
    argv = job_argv(config)
    if setting.secret:
        assert str(OTHER[name]) not in " ".join(argv)  # the key never on a command line
    elif name in ("top_k", "chat_template_kwargs"):  # body fields: they travel in the config's extra
        assert f'"{name}":' in argv[argv.index("--extra-body") + 1]
    else:
        assert setting.flag in argv


def test_every_setting_at_once_survives_the_units_command_line() -> None:
    config = job_config_of(OTHER)
    assert _round_trip(config) == config
    assert config.params.extra == {
        "min_p": 0.05,
        "stop": ["</s>"],
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_defaults_are_left_off_the_units_command_line() -> None:
    config = GenerateConfig(input=Path("/i"), output=Path("/o"), endpoints=["http://h:1"])
    assert job_argv(config) == ["--input", "/i", "--output", "/o", "--endpoint", "http://h:1"]
    assert _round_trip(config) == config


def test_the_command_lines_defaults_are_the_models() -> None:
    args = build_parser().parse_args(["generate", "-i", "/i", "-o", "/o", "-e", "http://h:1"])
    assert job_config(args, api_key=None) == GenerateConfig(
        input=Path("/i"), output=Path("/o"), endpoints=["http://h:1"], params=GenParams()
    )


def _module_source() -> str:
    return (ROOT / "library" / "generation_job.py").read_text()


def _module_argument_spec() -> dict[str, dict[str, Any]]:
    for node in ast.walk(ast.parse(_module_source())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AnsibleModule":
            spec = next(k.value for k in node.keywords if k.arg == "argument_spec")
            return ast.literal_eval(spec)
    raise AssertionError("no AnsibleModule(argument_spec=...) in library/generation_job.py")


def _module_documentation() -> dict[str, Any]:
    tree = ast.parse(_module_source())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCUMENTATION":
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError("no DOCUMENTATION in library/generation_job.py")


def test_the_modules_argument_spec_is_the_models() -> None:
    spec = _module_argument_spec()
    model = job_module_spec()
    assert set(spec) - MODULE_ONLY == set(model), "an option the model lacks, or a setting the module lacks"
    for name, entry in model.items():
        assert spec[name] == entry, name


def test_the_modules_documentation_is_the_models() -> None:
    options = _module_documentation()["options"]
    spec = _module_argument_spec()
    assert set(options) == set(spec)
    for name, entry in spec.items():
        doc = options[name]
        assert doc["type"] == entry["type"], name
        assert doc.get("default") == entry.get("default"), name
        assert doc.get("choices") == entry.get("choices"), name
        assert doc.get("required", False) == entry.get("required", False), name
        assert doc.get("elements") == entry.get("elements"), name


def test_role_generates_defaults_are_the_models() -> None:
    defaults = yaml.safe_load((ROOT / "roles" / "generate" / "defaults" / "main.yml").read_text())
    checked = 0
    for s in SETTINGS:
        key = f"generate_{s.name}"
        if key not in defaults or s.name in ROLE_CHOICES:
            continue
        assert defaults[key] == s.default, f"{key}: {defaults[key]!r}, the job's default is {s.default!r}"
        checked += 1
    assert checked >= 6  # concurrency, max_retries, request_timeout, force, metrics_port, metrics_bind, ...
    assert defaults["generate_max_tokens"] == ROLE_CHOICES["max_tokens"]


def test_settings_are_the_configs_fields_and_the_sampling_parameters() -> None:
    fields = {f.name for f in dataclasses.fields(GenerateConfig)}
    sampling = {"model", "max_tokens", "temperature", "top_p", "top_k", "chat_template_kwargs"}
    sampling |= {"extra_body", "turns", "keep_reasoning"}
    assert {s.name for s in SETTINGS} - fields == sampling
