"""The generation job's settings, each defined once: :class:`GenerateConfig`.

This module imports nothing heavy: ``sglfleet generate --help`` builds its arguments from it.

Every setting a user gives a job is declared here, once, with its name, type, default, help,
choices and argument type (:class:`Setting`); the rest is read off that declaration:

* the command line: ``sglfleet generate`` adds one argument per setting (:func:`settings`), with the
  setting's name as its ``dest``, and builds the config with :func:`from_args`;
* the systemd unit: :func:`to_argv` spells a config as the ``sglfleet generate`` arguments that give
  it back (``from_args(parse(to_argv(c))) == c``, tested over every setting);
* the Ansible module ``generation_job``: its options are the settings under the same names
  (:func:`module_argument_spec`, which a test holds its argument_spec and DOCUMENTATION to), and its
  parameters become a config with :func:`from_options`.

The sampling settings (model, max_tokens, ...) are the fields of :class:`GenParams` (declared here;
what the engine sets in every request body); ``top_k`` and
``chat_template_kwargs`` are spelled on their own but travel in its ``extra`` (:func:`sampling_extra`).
The engine's own tunables (fsync interval, probe interval, ...) are plain fields without a setting:
no user sets them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sglfleet.argtypes import finite_float, json_object, non_negative_float, port, positive_float
from sglfleet.gen._affinity import POLICIES
from sglfleet.gen._timeline import DEFAULT_INTERVAL_S as TIMELINE_INTERVAL_S

__all__ = [
    "GenParams",
    "GenerateConfig",
    "from_args",
    "from_options",
    "module_argument_spec",
    "settings",
    "to_argv",
]

Turns = Literal["last", "all"]
SAMPLING_KEYS = ("model", "max_tokens", "temperature", "top_p")


@dataclass(frozen=True)
class GenParams:
    """Generation parameters set in every request body: a value given here wins over the body's own
    (``sglfleet mix`` writes ``max_tokens`` into every body; ``--max-tokens 64`` means 64).

    ``extra``: more body fields (``top_k``, ``chat_template_kwargs``, ...), set in the same way.
    ``turns`` applies to conversation input: regenerate the last assistant turn or every one.
    ``keep_reasoning``: keep each answer's ``reasoning_content`` in its assistant turn of the
    conversation written with the result (chat requests of either input format), as SpecForge's
    ``regenerate_train_data.py --reasoning save`` does.
    """

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    turns: Turns = "last"
    keep_reasoning: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The fields set in request bodies."""
        fields = {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}
        return {**self.extra, **fields}

    def record(self) -> dict[str, Any]:
        """What the manifest records (a resume with other values is refused); the options that are
        off are left out, so manifests written before they existed still match."""
        out: dict[str, Any] = {k: getattr(self, k) for k in SAMPLING_KEYS}
        if self.extra:
            out["extra"] = self.extra
        if self.turns != "last":
            out["turns"] = self.turns
        if self.keep_reasoning:
            out["keep_reasoning"] = True
        return out


_MISSING = dataclasses.MISSING
_DISPATCH = tuple(sorted(POLICIES, key=lambda policy: policy != "prefix"))  # the default first


@dataclass(frozen=True)
class Setting:
    """One setting of the job. ``help`` may hold ``%(default)s``, written as the default reads
    (``600``, not ``600.0``)."""

    name: str  # the config's attribute, the module's option, argparse's dest
    help: str
    kind: str = "str"  # Ansible's type: str int float bool path list dict
    default: Any = None
    required: bool = False
    flags: tuple[str, ...] = ()  # the first is the long one; () for --NAME
    parse: Callable[[str], Any] | None = None  # the argument type on a command line
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    group: str | None = None  # the command line's argument group
    secret: bool = False  # never on a command line or in a log (the key's own flags are the CLI's)

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")

    @property
    def help_text(self) -> str:
        shown = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return self.help.replace("%(default)s", shown)


def _meta(**kw: Any) -> dict[str, Setting]:
    """A config field's metadata that makes it a setting (its name and default are the field's)."""
    return {"setting": Setting(name="", **kw)}


@dataclass
class GenerateConfig:
    input: Path = field(
        metadata=_meta(
            flags=("--input", "-i"), kind="path", parse=Path, help="OpenAI Batch JSONL or conversation JSONL"
        )
    )
    output: Path = field(
        metadata=_meta(
            flags=("--output", "-o"), kind="path", parse=Path, help="OpenAI Batch output JSONL (appended)"
        )
    )
    endpoints: list[str] = field(
        default_factory=list,
        metadata=_meta(
            flags=("--endpoint", "-e"),
            kind="list",
            metavar="URL",
            help="e.g. http://10.0.0.5:30000; repeat",
        ),
    )
    concurrency: int = field(
        default=32,
        metadata=_meta(
            flags=("--concurrency", "-c"),
            kind="int",
            parse=int,
            help="requests in flight per endpoint (%(default)s)",
        ),
    )
    # "prefix": a request goes where its longest prompt prefix went last, while that endpoint's load
    # allows (SGLang's prefix cache then skips that prefill); "least-loaded": fewest in flight only
    dispatch: str = field(
        default="prefix",
        metadata=_meta(
            choices=_DISPATCH,
            help="prefix (default): a request goes to the endpoint that served its longest prompt prefix "
            "last (turns of a conversation, a shared system prompt) while its load allows, else the "
            "least-loaded; least-loaded: fewest requests in flight only",
        ),
    )
    params: GenParams = field(default_factory=GenParams)  # the sampling settings: SAMPLING below
    max_retries: int = field(
        default=5,
        metadata=_meta(kind="int", parse=int, help="retries of a request on retryable errors (%(default)s)"),
    )
    request_timeout: float = field(
        default=600.0,
        metadata=_meta(kind="float", parse=positive_float, help="seconds per attempt (%(default)s)"),
    )
    backoff_base: float = field(
        default=1.0,
        metadata=_meta(kind="float", parse=positive_float, help="first retry delay in seconds (%(default)s)"),
    )
    # seconds in-flight requests get to finish after SIGINT/SIGTERM
    grace: float = field(
        default=30.0,
        metadata=_meta(
            kind="float",
            parse=non_negative_float,
            help="seconds in-flight requests get after SIGINT/SIGTERM (%(default)s)",
        ),
    )
    down_timeout: float = field(
        default=600.0,
        metadata=_meta(
            kind="float",
            parse=positive_float,
            help="give up when no endpoint answers this long (%(default)s)",
        ),
    )
    # seconds the preflight waits while no endpoint is ready but one answers "not yet" (a router
    # whose workers are still registering: /readiness 503; an instance starting: 503)
    start_timeout: float = field(
        default=120.0,
        metadata=_meta(
            kind="float",
            parse=non_negative_float,
            help="seconds to wait at the start while no endpoint is ready but one says not yet: a router "
            "with no healthy worker (/readiness 503), an instance starting (%(default)s; 0: do not wait)",
        ),
    )
    # seconds the preflight (and each re-probe) waits for an endpoint
    probe_timeout: float = field(
        default=10.0,
        metadata=_meta(
            kind="float",
            parse=positive_float,
            help="seconds the preflight waits for each endpoint's /health_generate (%(default)s)",
        ),
    )
    # stalled: nothing answered for this many times its recent latency, and at least stall_min seconds
    stall_factor: float = field(
        default=8.0,
        metadata=_meta(
            kind="float",
            parse=positive_float,
            help="an endpoint that answers nothing for this many times its recent latency is stalled "
            "(%(default)s)",
        ),
    )
    stall_min: float = field(
        default=2.0,
        metadata=_meta(
            kind="float", parse=positive_float, help="...and for at least this many seconds (%(default)s)"
        ),
    )
    max_resends: int = field(
        default=5,
        metadata=_meta(
            kind="int",
            parse=int,
            help="times one request is sent to another endpoint because the one it waits on stalled "
            "(%(default)s)",
        ),
    )
    # serve Prometheus text on metrics_bind:PORT/metrics (0: any port)
    metrics_port: int | None = field(
        default=None,
        metadata=_meta(
            kind="int",
            parse=port,
            metavar="PORT",
            help="serve Prometheus metrics on BIND:PORT/metrics while the job runs (0: any free port)",
        ),
    )
    metrics_bind: str = field(
        default="127.0.0.1",
        metadata=_meta(metavar="ADDR", help="address the metrics listen on (%(default)s)"),
    )
    # seconds the metrics stay up after the end, the final values in them
    metrics_linger: float = field(
        default=15.0,
        metadata=_meta(
            kind="float",
            parse=non_negative_float,
            metavar="S",
            help="seconds the metrics stay up after the end, with the final values and "
            "sglfleet_generate_exit_code, for the last scrape (%(default)s; a signal ends the wait)",
        ),
    )
    api_key: str | None = field(
        default=None,
        metadata=_meta(secret=True, help="the SGLang API key (never on a command line: the unit's env file)"),
    )
    force: bool = field(
        default=False,
        metadata=_meta(kind="bool", help="continue an output whose manifest has another input or parameters"),
    )
    # the engine's tunables: no setting
    backoff_cap: float = 60.0
    fsync_interval: float = 1.0
    manifest_interval: float = 5.0
    timeline_interval: float = TIMELINE_INTERVAL_S  # a sample of OUT.timeline.jsonl
    down_after: int = 3
    probe_interval: float = 1.0
    # Seconds between /health probes of the endpoints that are up: a draining SGLang (SIGTERM, a
    # rolling restart) answers 503 there while it still accepts requests; it gets no new ones.
    watch_interval: float | None = 5.0


_NO_PARAMS = GenParams()
_SAMPLING_GROUP = (
    "sampling (each one given is set in every request body, over the body's own value; the manifest "
    "records them)"
)
# The sampling settings: GenParams's fields (defaults from it), top_k and chat_template_kwargs into its extra.
SAMPLING = (
    Setting("model", "model name", group=_SAMPLING_GROUP),
    Setting("max_tokens", "max_tokens", kind="int", parse=int, group=_SAMPLING_GROUP),
    Setting("temperature", "temperature", kind="float", parse=finite_float, group=_SAMPLING_GROUP),
    Setting("top_p", "top_p", kind="float", parse=finite_float, group=_SAMPLING_GROUP),
    Setting("top_k", "top_k (SGLang's extra sampling field)", kind="int", parse=int, group=_SAMPLING_GROUP),
    Setting(
        "chat_template_kwargs",
        "chat_template_kwargs, e.g. '{\"enable_thinking\": false}'",
        kind="dict",
        parse=json_object,
        metavar="JSON",
        group=_SAMPLING_GROUP,
    ),
    Setting(
        "extra_body",
        "more body fields, e.g. '{\"min_p\": 0.05}'",
        kind="dict",
        parse=json_object,
        metavar="JSON",
        group=_SAMPLING_GROUP,
    ),
    Setting(
        "turns",
        "conversation input: regenerate the last assistant turn (default) or every one in order, "
        "each from the regenerated turns before it (SpecForge's regenerate_train_data.py)",
        default=_NO_PARAMS.turns,
        choices=("last", "all"),
    ),
    Setting(
        "keep_reasoning",
        "write each result's conversation with the answer's reasoning_content in its assistant "
        "turn (SpecForge's --reasoning save), for chat requests of either input format; merge keeps it",
        kind="bool",
        default=_NO_PARAMS.keep_reasoning,
    ),
)


def _config_settings() -> list[Setting]:
    out = []
    for f in dataclasses.fields(GenerateConfig):
        meta = f.metadata.get("setting")
        if meta is None:
            continue
        default = f.default_factory() if f.default_factory is not _MISSING else f.default
        out.append(
            dataclasses.replace(
                meta,
                name=f.name,
                default=None if default is _MISSING else default,
                required=default is _MISSING,
            )
        )
    return out


def settings() -> tuple[Setting, ...]:
    """Every setting of the job, in the order the command line lists them (the sampling ones where
    the config holds them)."""
    ordered: list[Setting] = []
    for s in _CONFIG_SETTINGS:
        if s.name == "max_retries":
            ordered.extend(SAMPLING)
        ordered.append(s)
    return tuple(ordered)


_CONFIG_SETTINGS = _config_settings()
_CONFIG_NAMES = frozenset(s.name for s in _CONFIG_SETTINGS)


def sampling_extra(
    extra_body: Mapping[str, Any] | None, top_k: int | None, chat_template_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The body fields beyond GenParams's own: ``extra_body``, with ``top_k`` and
    ``chat_template_kwargs`` over it when given."""
    extra = dict(extra_body or {})
    if top_k is not None:
        extra["top_k"] = top_k
    if chat_template_kwargs is not None:
        extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    return extra


def options_of(config: GenerateConfig) -> dict[str, Any]:
    """Each setting's value in ``config``, by name (``top_k`` and ``chat_template_kwargs`` are in
    ``extra_body``, where the config keeps them)."""
    p = config.params
    values = {name: getattr(config, name) for name in _CONFIG_NAMES}
    values.update(
        model=p.model,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=None,
        chat_template_kwargs=None,
        extra_body=dict(p.extra) or None,
        turns=p.turns,
        keep_reasoning=p.keep_reasoning,
    )
    return values


def from_options(values: Mapping[str, Any], **overrides: Any) -> GenerateConfig:
    """The config of ``values`` (setting name -> value: argparse's namespace, the module's params);
    a setting missing or None takes its default; ``overrides`` are config fields set as they are."""

    def get(s: Setting) -> Any:
        value = values.get(s.name)
        if value is None:
            return s.default
        if s.kind == "path":
            return Path(value)
        return list(value) if s.kind == "list" else value

    v = {s.name: get(s) for s in settings()}
    params = GenParams(
        v["model"],
        v["max_tokens"],
        v["temperature"],
        v["top_p"],
        extra=sampling_extra(v["extra_body"], v["top_k"], v["chat_template_kwargs"]),
        turns=v["turns"],
        keep_reasoning=v["keep_reasoning"],
    )
    fields = {name: v[name] for name in _CONFIG_NAMES}
    return GenerateConfig(**{**fields, "params": params, **overrides})


def from_args(args: Any, **overrides: Any) -> GenerateConfig:
    """The config of a parsed ``sglfleet generate`` command line (see :func:`from_options`)."""
    return from_options(vars(args), **overrides)


def to_argv(config: GenerateConfig) -> list[str]:
    """The ``sglfleet generate`` arguments that give ``config`` back: every setting that differs
    from its default (the required ones always), none that is secret (the API key travels in the
    environment)."""
    values = options_of(config)
    argv: list[str] = []
    for s in settings():
        value = values[s.name]
        if s.secret or value is None or (value == s.default and not s.required):
            continue
        if s.kind == "bool":
            argv += [s.flag] if value else []
        elif s.kind == "list":
            for item in value:
                argv += [s.flag, str(item)]
        elif s.kind == "dict":
            argv += [s.flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        else:
            argv += [s.flag, str(value)]
    return argv


def module_argument_spec() -> dict[str, dict[str, Any]]:
    """The options the module ``generation_job`` takes for the settings: its argument_spec holds
    these entries (a test checks it and the module's DOCUMENTATION against them)."""
    spec: dict[str, dict[str, Any]] = {}
    for s in settings():
        entry: dict[str, Any] = {"type": s.kind}
        if s.required:
            entry["required"] = True
        if s.kind == "list":
            entry["elements"] = "str"
        if s.choices:
            entry["choices"] = list(s.choices)
        if s.default is not None:
            entry["default"] = s.default
        if s.secret:
            entry["no_log"] = True
        elif "token" in s.name:
            entry["no_log"] = False  # a count of tokens, not a secret (Ansible warns of the name)
        spec[s.name] = entry
    return spec
