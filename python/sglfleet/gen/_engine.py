"""The generation engine: every request of an input file, exactly once, across a fleet of endpoints.

:func:`run` is what ``sglfleet generate`` calls: validate the whole input (nothing is sent while any
line is bad), check the output's manifest (a changed input or changed parameters are refused unless
forced), probe every endpoint (start on those that answer), open the output (cut a torn last line,
read the ids already done), then send the missing requests, read back from exactly the bytes that
were validated, to the endpoints, fewest in flight first, with retries, and write each result as
it comes. A request whose endpoint stalls is sent to another one too; the first answer wins.

This module is the orchestration: the run's stages, in order, and its verdict. Each request's
lifecycle is :mod:`sglfleet.gen._requests`'s, the manifest's :mod:`sglfleet.gen._manifest`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from sglfleet.exitcodes import ExitCode
from sglfleet.gen import _client as client
from sglfleet.gen import _manifest as manifest
from sglfleet.gen import _timeline as timeline
from sglfleet.gen._affinity import POLICIES, PrefixAffinity
from sglfleet.gen._config import GenerateConfig
from sglfleet.gen._dispatch import Endpoint, EndpointPool
from sglfleet.gen._formats import (
    GenParams,
    InputChanged,
    InputFormat,
    LineError,
    ScanResult,
    read_requests,
    scan_input,
)
from sglfleet.gen._progress import LogReporter, Reporter, Stats
from sglfleet.gen._requests import RequestPolicy, RequestRunner, is_disk_full
from sglfleet.gen._store import OutputStore, Resumed, StoreError, errors_path
from sglfleet.outpath import output_problem

__all__ = ["ExitCode", "Outcome", "check_config", "run"]


@dataclass
class Outcome:
    exit_code: ExitCode
    message: str
    input_errors: list[LineError] = field(default_factory=list)
    manifest: manifest.Manifest | None = None
    # what to run next: "rerun" (the same command), "force" (the same with --force), None (fix the
    # input or arguments first, or nothing: done); filled from the exit code unless set
    next: str | None = None


class Refused(Exception):
    """A stage's refusal to go on: the run ends with ``outcome`` (raised by the stages before the
    sending, caught once, in :func:`run_async`)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.outcome = outcome


def _refuse(code: ExitCode, message: str, input_errors: list[LineError] | None = None) -> Refused:
    return Refused(Outcome(code, message, input_errors or []))


_NEXT = {
    ExitCode.FATAL: "rerun",
    ExitCode.FAILURES: "rerun",
    ExitCode.AUTH: "rerun",
    ExitCode.NO_ENDPOINT: "rerun",
    ExitCode.INPUT_CHANGED: "force",
    ExitCode.DISK_FULL: "rerun",
    ExitCode.INTERRUPTED: "rerun",
}


def check_config(config: GenerateConfig) -> list[str]:
    """Every problem with ``config`` that can be seen before anything is read or sent, in words."""
    return [
        *_endpoint_problems(config.endpoints),
        *_option_problems(config),
        *_sampling_problems(config.params),
        *_path_problems(Path(config.input), Path(config.output)),
    ]


def _endpoint_problems(urls: list[str]) -> list[str]:
    if not urls:
        return ["no endpoint: give --endpoint URL (or --endpoints-file)"]
    from sglfleet.fleet import endpoint_from_url

    problems = []
    seen: dict[str, int] = {}
    reach: dict[tuple[str, str, int], int] = {}
    for i, url in enumerate(urls):
        try:
            base = endpoint_from_url(url, where=f"endpoint {i + 1}").url
        except ValueError as exc:
            problems.append(f"{exc} (e.g. http://10.0.0.5:30000)")
            continue
        if base in seen:
            problems.append(f"endpoint {i + 1}: {url} is listed twice")
            continue
        seen[base] = i
        where = _listeners(url) if len(urls) > 1 else frozenset()
        same = next(((reach[w], w) for w in sorted(where) if w in reach), None)
        if same is not None:
            j, (_, address, port) = same
            problems.append(
                f"endpoint {i + 1}: {url} is the same server as endpoint {j + 1} ({urls[j]}): both reach "
                f"{address} port {port}"
            )
            continue
        reach.update(dict.fromkeys(where, i))
    return problems


def _listeners(url: str) -> frozenset[tuple[str, str, int]]:
    """Where a connection to ``url`` can land: (scheme, address, port) for every address its host
    resolves to (the name itself when it does not resolve: the preflight then says so). `localhost`,
    `127.0.0.1` and `http://127.0.0.1:80` vs `http://127.0.0.1` share one; `[::1]` and `127.0.0.1` do not."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return frozenset({(parts.scheme, host, port)})
    return frozenset((parts.scheme, str(info[4][0]), port) for info in infos)


def _option_problems(config: GenerateConfig) -> list[str]:
    port = config.metrics_port
    checks = (
        (config.concurrency < 1, "--concurrency must be at least 1"),
        (
            config.dispatch not in POLICIES,
            f"--dispatch must be one of {', '.join(POLICIES)}, not {config.dispatch!r}",
        ),
        (config.max_retries < 0, "--max-retries must be 0 or more"),
        (config.request_timeout <= 0, "--request-timeout must be positive"),
        (config.max_resends < 0, "--max-resends must be 0 or more"),
        (
            port is not None and not 0 <= port <= 65535,
            f"--metrics-port {port} is not a TCP port (0-65535; 0: any free one)",
        ),
        (config.metrics_linger < 0, "--metrics-linger must be 0 or more"),
        (config.grace < 0, "--grace must be 0 or more"),
    )
    seconds = {
        "--grace": config.grace,
        "--request-timeout": config.request_timeout,
        "--backoff-base": config.backoff_base,
        "--down-timeout": config.down_timeout,
        "--probe-timeout": config.probe_timeout,
        "--stall-factor": config.stall_factor,
        "--stall-min": config.stall_min,
        "--metrics-linger": config.metrics_linger,
    }
    not_finite = [
        f"{flag} {value} is not a finite number"
        for flag, value in seconds.items()
        if not math.isfinite(value)
    ]
    return not_finite + [message for wrong, message in checks if wrong]


def _sampling_problems(p: GenParams) -> list[str]:
    problems = [
        f"{name} {value} is not a finite number"
        for name, value in (("--temperature", p.temperature), ("--top-p", p.top_p))
        if value is not None and not math.isfinite(value)
    ]
    if p.max_tokens is not None and p.max_tokens < 1:
        problems.append(f"--max-tokens {p.max_tokens} must be at least 1")
    return problems


def _path_problems(input_path: Path, output: Path) -> list[str]:
    problems = [] if input_path.is_file() else [f"input {input_path} is not a file"]
    return problems + _output_problems(output, input_path)


def _output_problems(output: Path, input_path: Path) -> list[str]:
    """Why the output or a file the job writes next to it (its errors file, manifest, timeline)
    cannot be written, found before anything is sent (:func:`sglfleet.outpath.output_problem`, the
    check mix and merge make too): the first of them that is the input, is not a regular file (a
    directory, device, FIFO, socket, or a symlink to one), is read-only, or cannot be created; one of
    the files next to it that is the output (or another of them) under another name, or another job's
    output (it has a manifest of its own); or an output that is another job's errors file, manifest or
    timeline (that job empties or replaces it on each run)."""
    hint = "give a file path for --output"
    problem = output_problem(output, "output", {"input": input_path}, hint=hint) or _companion_of_a_job(
        output
    )
    if problem is not None:
        return [problem]
    written = {"input": input_path, "output": output}
    for path, what, name in (
        (errors_path(output), "the output's errors file", "errors file"),
        (manifest.manifest_path(output), "the output's manifest", "manifest"),
        (timeline.timeline_path(output), "the output's timeline", "timeline"),
    ):
        problem = output_problem(path, what, written, hint=hint)
        if problem is None and path.is_file() and manifest.manifest_path(path).exists():
            problem = (
                f"{what} {path} is another job's output (it has {manifest.manifest_path(path)}): this job "
                "would empty it; choose another --output"
            )
        if problem is not None:
            return [problem]
        written[name] = path
    return []


_COMPANIONS = {".errors.jsonl": "errors file", ".manifest.json": "manifest", ".timeline.jsonl": "timeline"}


def _companion_of_a_job(output: Path) -> str | None:
    """Why ``output`` is a file another job writes next to its own output (that job's errors file,
    manifest or timeline, which it empties or replaces on each run); None when it is not."""
    for suffix, what in _COMPANIONS.items():
        if output.name.endswith(suffix) and len(output.name) > len(suffix):
            job = output.with_name(output.name[: -len(suffix)])
            # X.manifest.json as an output is only X's manifest when there is an X it describes
            if manifest.manifest_path(job).exists() and (suffix != ".manifest.json" or job.is_file()):
                return (
                    f"output {output} is the {what} of the job {job} (it has {manifest.manifest_path(job)}), "
                    "which empties or replaces it on each run: choose another --output"
                )
    return None


class _Interrupt:
    """SIGINT/SIGTERM: the first stops sending (in-flight requests get the grace period), the second
    ends them at once."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.signalled = False

    def __call__(self) -> None:
        if self.signalled:
            self.force.set()
        self.signalled = True
        self.stop.set()


INTERRUPTED_EARLY = "interrupted before anything was sent; rerun the same command"


async def run_async(
    config: GenerateConfig, reporter: Reporter | None = None, handle_signals: bool = True
) -> Outcome:
    """Run the job; see :class:`ExitCode` for what the outcome's exit code means, ``next`` for what
    to run then."""
    outcome = await _run_async(config, reporter, handle_signals)
    if outcome.next is None:
        outcome.next = _NEXT.get(outcome.exit_code)
    return outcome


async def _run_async(config: GenerateConfig, reporter: Reporter | None, handle_signals: bool) -> Outcome:
    interrupt = _Interrupt()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
    for sig in signals:  # before anything else: an interrupt at any moment exits 130, resumably
        loop.add_signal_handler(sig, interrupt)
    try:
        problems = check_config(config)
        if problems:
            return Outcome(ExitCode.BAD_INPUT, "; ".join(problems))
        # what the run opens (the output, the metrics server, the session, the pool) is closed here
        async with contextlib.AsyncExitStack() as resources:
            prepared = await _prepare(config, interrupt, resources)
            return await _execute(config, prepared, reporter, interrupt, resources)
    except Refused as refused:
        return refused.outcome
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


@dataclass
class _Prepared:
    scan: ScanResult
    previous: manifest.Manifest | None
    store: OutputStore
    resumed: Resumed
    pending: list[int]
    live: list[str]  # the endpoints that answered the preflight, in the order given
    routers: set[str] = field(default_factory=set)  # those that are sglang-routers (/readiness)


async def _prepare(
    config: GenerateConfig, interrupt: _Interrupt, resources: contextlib.AsyncExitStack
) -> _Prepared:
    """Validate, check the manifest, probe the endpoints, open the output (closed with ``resources``);
    :class:`Refused` to refuse."""
    previous = _load_previous(config)
    scan = await _scan(config, previous)
    _unless_interrupted(interrupt)
    _refuse_unless_fit(config, scan, previous)
    live, routers = await _preflight(config, interrupt)
    _unless_interrupted(interrupt)
    store, resumed, pending = await _open_output(config, scan)
    resources.callback(store.close)
    _unless_interrupted(interrupt)
    return _Prepared(scan, previous, store, resumed, pending, live, routers)


def _unless_interrupted(interrupt: _Interrupt) -> None:
    if interrupt.signalled:
        raise _refuse(ExitCode.INTERRUPTED, INTERRUPTED_EARLY)


def _load_previous(config: GenerateConfig) -> manifest.Manifest | None:
    """The manifest of the runs before this one (None: none ran); refused when it is unreadable."""
    try:
        return manifest.load(manifest.manifest_path(Path(config.output)))
    except manifest.ManifestError as exc:
        raise _refuse(ExitCode.BAD_INPUT, f"{exc}; remove it or choose another output") from None


async def _scan(config: GenerateConfig, previous: manifest.Manifest | None) -> ScanResult:
    """Validate every line of the input (in a thread), its bytes hashed as they are read."""
    prefix = previous.input.size if previous is not None else None
    # a resume of the same job: its input was validated by an earlier run, with these settings
    same_job = previous is not None and previous.params == config.params.record()
    return await asyncio.to_thread(
        scan_input,
        Path(config.input),
        all_turns=config.params.turns == "all",
        prefix_size=prefix,
        trusted_sha256=previous.input.sha256 if same_job and previous is not None else None,
    )


def _refuse_unless_fit(config: GenerateConfig, scan: ScanResult, previous: manifest.Manifest | None) -> None:
    """Refuse this input, with these options, when it is not sent (a changed input first, then bad
    lines, then options that do not apply to it, then another job's output)."""
    refused = _check_previous(config, scan, previous)
    if refused is not None and refused.exit_code is ExitCode.INPUT_CHANGED:
        if scan.errors:  # the change is the news; its bad lines follow
            refused.message += f" The input now has {len(scan.errors)} bad line(s) too."
            refused.input_errors = scan.errors
        raise Refused(refused)
    if not scan.ok or scan.format is None:
        n = len(scan.errors)
        raise _refuse(
            ExitCode.BAD_INPUT, f"{config.input}: {n} bad line{'s' * (n != 1)}; nothing was sent", scan.errors
        )
    unfit = _params_unfit(config, scan)
    if unfit is not None:
        raise _refuse(ExitCode.BAD_INPUT, f"{unfit}; nothing was sent")
    if refused is not None:
        raise Refused(refused)


async def _open_output(config: GenerateConfig, scan: ScanResult) -> tuple[OutputStore, Resumed, list[int]]:
    """The output opened (a torn last line cut, the ids done read) and the requests still to send;
    refused when it cannot be used."""
    store = OutputStore(Path(config.output), config.fsync_interval)

    def open_store() -> tuple[Resumed, list[int]]:
        resumed = store.open()
        return resumed, scan.pending(resumed.done)

    try:
        resumed, pending = await asyncio.to_thread(open_store)
    except StoreError as exc:
        raise _refuse(ExitCode.BAD_INPUT, str(exc)) from None
    except OSError as exc:
        with contextlib.suppress(OSError):
            store.close()
        code = ExitCode.DISK_FULL if is_disk_full(exc) else ExitCode.BAD_INPUT  # nothing was sent
        raise _refuse(
            code, f"cannot use {config.output} as the output: {exc.strerror or exc}; nothing was sent"
        ) from None
    return store, resumed, pending


def _params_unfit(config: GenerateConfig, scan: ScanResult) -> str | None:
    """Why an option cannot apply to this input (refused rather than ignored); None when it can."""
    if config.params.turns == "all" and scan.format is InputFormat.BATCH:
        return (
            f"--turns all applies to conversation input (id, conversations); {config.input} is OpenAI "
            "Batch input, whose requests are sent as they are: drop --turns all"
        )
    if config.params.keep_reasoning and scan.text_requests:
        return (
            f"--keep-reasoning applies to chat requests; {config.input} has {scan.text_requests} "
            "/v1/completions request(s), whose answers carry no reasoning_content: drop --keep-reasoning"
        )
    return None


def _check_previous(
    config: GenerateConfig, scan: ScanResult, previous: manifest.Manifest | None
) -> Outcome | None:
    """Why the output belongs to another job (another input, other parameters, no manifest); None
    when this run continues it (or starts it, or is forced)."""
    if previous is None:
        if _has_content(Path(config.output)) and not config.force:
            mpath = manifest.manifest_path(Path(config.output))
            return Outcome(
                ExitCode.BAD_INPUT,
                f"{config.output} exists but has no manifest ({mpath}): "
                "use --force to resume into it, or another --output",
            )  # exit 2, no `next:` line (docs/exit-codes.md): which of the two is for the user to say
        return None
    if config.force:
        return None
    reasons = manifest.mismatches(
        previous, scan.sha256, config.params.record(), scan.size, scan.prefix_sha256
    )
    if not reasons:
        return None
    code = ExitCode.INPUT_CHANGED if previous.input.sha256 != scan.sha256 else ExitCode.BAD_INPUT
    return Outcome(
        code,
        f"{config.output} belongs to another job: {'; '.join(reasons)}. "
        "Use --force to continue it anyway (results already written are kept), or another --output",
    )  # exit 6 prints `next: ... --force` (a changed input); exit 2 (other parameters) none


NOT_YET = frozenset({"starting", "not ready"})  # answers of an endpoint that will be ready soon
START_PROBE_INTERVAL = 2.0  # seconds between preflight probes while waiting (as `sglfleet health --wait`)


async def _preflight(config: GenerateConfig, interrupt: _Interrupt) -> tuple[list[str], set[str]]:
    """Probe every endpoint at once with the fleet's health probe: the ones that answer (and which of
    them are routers); refused when none does, or when every one that does refuses the key. While
    none is ready but one says "not yet" (a router whose workers are still registering answers
    /readiness 503), probe again for up to ``start_timeout``."""
    from sglfleet.fleet import endpoints_from_urls, probe_fleet_async

    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.start_timeout
    while True:
        rows = await probe_fleet_async(
            endpoints_from_urls(config.endpoints), api_key=config.api_key, probe_timeout=config.probe_timeout
        )
        live = [r.url for r in rows if r.healthy]
        waiting = not live and any(r.reason in NOT_YET for r in rows)
        if not waiting or loop.time() + START_PROBE_INTERVAL > deadline or interrupt.signalled:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(interrupt.stop.wait(), START_PROBE_INTERVAL)
    if not live:
        causes = "; ".join(f"{r.url}: {r.reason}" + (f" ({r.detail})" if r.detail else "") for r in rows)
        raise _refuse(
            ExitCode.NO_ENDPOINT,
            f"no endpoint answers /health_generate ({causes}); nothing was sent, rerun when the fleet is up",
        )
    routers = {r.url for r in rows if r.router}
    denied = [r for r in rows if r.healthy and r.key_refused]
    if len(denied) == len(live):
        raise _refuse(
            ExitCode.AUTH,
            f"401 Unauthorized from {denied[0].url}/model_info: check the API key "
            f"({'none was given' if not config.api_key else 'the one given is refused'}); nothing was sent",
        )
    return live, routers


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


async def _execute(
    config: GenerateConfig,
    prepared: _Prepared,
    reporter: Reporter | None,
    interrupt: _Interrupt,
    resources: contextlib.AsyncExitStack,
) -> Outcome:
    """Send the pending requests and write their results; the outcome of the run. ``resources``
    closes what this opens: the metrics server, the pool, the session."""
    stats = _stats_at_start(prepared)
    if stats.done:  # what this run will not send again
        print(f"resuming: {stats.done} of {stats.total} already done", file=sys.stderr, flush=True)
    writer = manifest.ManifestWriter(
        Path(config.output),
        _input_info(config, prepared.scan),
        config.params.record(),
        prepared.previous,
        prepared.store.summary,
    )
    reporter = reporter or LogReporter(sys.stdout)
    # a connection per request slot, as many again for overdue requests whose slot was given back
    # (EndpointPool.detach: a frozen worker behind a router may hold every slot), and one each for
    # an endpoint's health watcher and prober: a request or a probe never waits for a connection
    # (aiohttp's queue of waiters costs CPU per release)
    session = client.make_session((2 * config.concurrency + 2) * len(config.endpoints), config.api_key)
    resources.push_async_callback(session.close)
    pool = _make_pool(config, session, prepared.live, prepared.routers)
    resources.push_async_callback(pool.aclose)
    metrics = await _start_metrics(config, stats, pool)
    if metrics is not None:
        resources.push_async_callback(metrics.cleanup)
    runner = RequestRunner(
        RequestPolicy.of(config),
        store=prepared.store,
        stats=stats,
        pool=pool,
        session=session,
        stop=interrupt.stop,
    )
    _write_first_manifest(writer, stats, pool)
    await _send(config, prepared, runner, writer, reporter, force=interrupt.force)
    await pool.aclose()  # the endpoints are no longer watched (their states are the final ones)
    code, msg, m = _write_last_manifest(writer, runner, _verdict(runner, stats, interrupt, prepared.store))
    stats.exit_code = int(code)  # the metrics say it from now on
    if metrics is not None:
        await _linger(config, interrupt)
    return Outcome(code, msg, manifest=m)


def _stats_at_start(prepared: _Prepared) -> Stats:
    scan, resumed = prepared.scan, prepared.resumed
    stats = Stats(total=scan.requests, done=scan.requests - len(prepared.pending))
    stats.prompt_tokens, stats.completion_tokens = resumed.prompt_tokens, resumed.completion_tokens
    return stats


def _input_info(config: GenerateConfig, scan: ScanResult) -> manifest.InputInfo:
    return manifest.InputInfo(
        path=str(Path(config.input).absolute()),  # merge reads it from anywhere
        sha256=scan.sha256,
        format=str(scan.format),
        requests=scan.requests,
        size=scan.size,
    )


def _write_first_manifest(writer: manifest.ManifestWriter, stats: Stats, pool: EndpointPool) -> None:
    """The manifest says "running" before the first request is sent; refused when it cannot be written."""
    try:
        writer.save(stats, "running", pool.endpoints)
    except OSError as exc:
        code = ExitCode.DISK_FULL if is_disk_full(exc) else ExitCode.FATAL
        raise _refuse(code, f"cannot write the manifest {writer.path}: {exc}; nothing was sent") from None


async def _send(
    config: GenerateConfig,
    prepared: _Prepared,
    runner: RequestRunner,
    writer: manifest.ManifestWriter,
    reporter: Reporter,
    *,
    force: asyncio.Event,
) -> None:
    """Send every pending request, the progress and the manifest kept up to date meanwhile; then
    end the requests still in flight and sync the output."""
    stats, pool = runner.stats, runner.pool
    batches = read_requests(Path(config.input), prepared.scan, prepared.pending, config.params)
    samples = timeline.TimelineWriter(config.output)
    with reporter:
        background = [
            asyncio.create_task(_report_every(reporter, stats, pool)),
            asyncio.create_task(_save_manifest_every(config.manifest_interval, runner, writer)),
            asyncio.create_task(runner.resend_stalled(min(0.5, config.stall_min / 4))),
            asyncio.create_task(_timeline_every(config.timeline_interval, runner, samples, writer.runs)),
        ]
        try:
            await runner.send_all(batches, force)
        except InputChanged as exc:
            runner.halt(str(exc), ExitCode.INPUT_CHANGED)
            await runner.cancel_in_flight()
        finally:
            await _cancel(background)
            await runner.cancel_in_flight()
            try:
                prepared.store.sync()
            except OSError as exc:
                runner.halt_on_write_error(f"the output {config.output}", exc)
        reporter.update(stats, pool.endpoints)
        _timeline_sample(runner, samples, writer.runs)


def _timeline_sample(runner: RequestRunner, samples: timeline.TimelineWriter, run: int) -> None:
    """Append a sample to OUT.timeline.jsonl (what `sglfleet job report` draws); a picture is not
    worth a job: an error writing it is ignored."""
    s = runner.stats
    record = timeline.sample(
        run=run,
        total=s.total,
        done=s.done,
        failed=s.failed,
        completion_tokens=s.completion_tokens_this_run,
        endpoints=runner.pool.endpoints,
        now=datetime.now(UTC),
    )
    with contextlib.suppress(OSError):
        samples.append(record)


async def _timeline_every(
    interval: float, runner: RequestRunner, samples: timeline.TimelineWriter, run: int
) -> None:
    while True:
        _timeline_sample(runner, samples, run)
        await asyncio.sleep(interval)


def _write_last_manifest(
    writer: manifest.ManifestWriter, runner: RequestRunner, verdict: tuple[ExitCode, manifest.Status, str]
) -> tuple[ExitCode, str, manifest.Manifest | None]:
    """The manifest with the verdict; when it cannot be written, the previous one is kept and the
    run does not end OK (exit code, message and manifest as the run ends). On a full disk, where the
    atomic rewrite needs room for a new file, the verdict is written over the manifest in place
    (:func:`_save_in_place`), so that `sglfleet job status` says the run stopped for want of room
    rather than that it was killed before it could say so."""
    code, status, msg = verdict
    m = writer.build(runner.stats, status, runner.pool.endpoints, msg)
    try:
        manifest.save(writer.path, m)
        return code, msg, m
    except OSError as exc:
        if is_disk_full(exc):
            with contextlib.suppress(OSError):
                _save_in_place(writer.path, m)
                return code, msg, m
            code = ExitCode.DISK_FULL
        msg = f"{msg}; the manifest could not be updated ({exc}), the previous one is kept"
        return code if code != ExitCode.OK else ExitCode.FATAL, msg, None


def _save_in_place(path: Path, m: manifest.Manifest) -> None:
    """``m`` written over the manifest at ``path`` in the room its file already has (compact JSON,
    padded with spaces, which JSON ignores, to the old length): no new block, so a full disk takes
    it. One ``pwrite``; OSError when it does not fit or there is no manifest to write over."""
    data = orjson.dumps(m.model_dump(mode="json")) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or len(data) > max(st.st_size, st.st_blocks * 512):
            raise OSError(errno.ENOSPC, "no room in the manifest's own blocks", str(path))
        os.pwrite(fd, data.ljust(st.st_size), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


async def _linger(config: GenerateConfig, interrupt: _Interrupt) -> None:
    """Keep the metrics endpoint up ``metrics_linger`` seconds after the end, its final values and
    the exit code in it, so that a scrape after the end reads them (a signal ends the wait)."""
    if config.metrics_linger > 0 and not interrupt.signalled:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(interrupt.stop.wait(), config.metrics_linger)


def _make_pool(
    config: GenerateConfig, session: aiohttp.ClientSession, live: list[str], routers: set[str] = frozenset()
) -> EndpointPool:
    """The endpoints, those that did not answer the preflight taken out (the prober waits for them).
    A router is watched and probed at its /readiness: its /health says 200 with no worker up."""

    async def probe(ep: Endpoint) -> bool:
        path = "/readiness" if ep.url in routers else "/health"
        return await client.probe_health(
            session, ep.url, min(config.probe_timeout, config.request_timeout), path
        )

    pool = EndpointPool(
        config.endpoints,
        config.concurrency,
        probe,
        down_after=config.down_after,
        probe_interval=config.probe_interval,
        down_timeout=config.down_timeout,
        stall_factor=config.stall_factor,
        stall_min=config.stall_min,
        watch_interval=config.watch_interval,
        affinity=PrefixAffinity() if config.dispatch == "prefix" else None,
    )
    for ep in pool.endpoints:
        if ep.url not in live:
            pool.take_out(ep)
    return pool


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _report_every(reporter: Reporter, stats: Stats, pool: EndpointPool) -> None:
    while True:
        await asyncio.sleep(reporter.interval)
        reporter.update(stats, pool.endpoints)


async def _save_manifest_every(
    interval: float, runner: RequestRunner, writer: manifest.ManifestWriter
) -> None:
    """The manifest on its own timer, whatever the log interval (what `job status` reads)."""
    while True:
        await asyncio.sleep(interval)
        m = writer.build(runner.stats, "running", runner.pool.endpoints)
        saving = asyncio.ensure_future(asyncio.to_thread(manifest.save, writer.path, m))
        try:
            await asyncio.shield(saving)
        except asyncio.CancelledError:
            # the run is ending: let this save finish before the final one, never after it
            with contextlib.suppress(Exception):
                await saving
            raise
        except OSError as exc:
            runner.halt_on_write_error(f"the manifest {writer.path}", exc)
            return


async def _start_metrics(config: GenerateConfig, stats: Stats, pool: EndpointPool) -> Any:
    """The metrics server's runner (None without --metrics-port); refused when it cannot listen."""
    if config.metrics_port is None:
        return None
    from sglfleet.gen._metrics import start

    try:
        runner, port = await start(config.metrics_bind, config.metrics_port, stats, pool)
    except OSError as exc:
        raise _refuse(
            ExitCode.BAD_INPUT,
            f"--metrics-port {config.metrics_port}: cannot listen on {config.metrics_bind}: {exc.strerror}",
        ) from None
    stats.metrics_port = port
    print(f"generate: metrics on http://{config.metrics_bind}:{port}/metrics", file=sys.stderr, flush=True)
    return runner


def _verdict(
    runner: RequestRunner, stats: Stats, interrupt: _Interrupt, store: OutputStore
) -> tuple[ExitCode, manifest.Status, str]:
    if runner.fatal:
        hint = {
            ExitCode.INPUT_CHANGED: "; the manifest keeps the input as it was validated: restore it and "
            "rerun, or rerun with --force to go on with the input as it is now (results already written "
            "are kept)",
            ExitCode.AUTH: "; give the right key, then rerun the same command to resume",
            ExitCode.DISK_FULL: "",  # the message says it: free some and rerun
        }.get(runner.fatal_code, "; rerun the same command to resume")
        return runner.fatal_code, "failed", f"stopped: {runner.fatal}{hint}"
    if interrupt.signalled:
        return ExitCode.INTERRUPTED, "interrupted", "interrupted; rerun the same command to resume"
    if stats.failed:
        return (
            ExitCode.FAILURES,
            "complete_with_failures",
            f"done with {stats.failed} permanent failure(s), see {store.errors_path}; a rerun retries them",
        )
    if stats.remaining:
        return ExitCode.FATAL, "failed", f"{stats.remaining} request(s) left unsent; rerun the same command"
    return ExitCode.OK, "complete", "complete"


def run(config: GenerateConfig, reporter: Reporter | None = None, handle_signals: bool = True) -> Outcome:
    """Run the job on its own event loop (uvloop's where installed: ~5% less CPU per request here)."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(run_async(config, reporter, handle_signals))
