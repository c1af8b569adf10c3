"""Where the fleet stands: the phase checklist (from the ledger) and one row per instance.

`gather_status` reads the ledger, probes the instances (`sglfleet.fleet._health`) and, when the host has
nvidia-smi, adds each instance's GPU memory (`sglfleet.fleet._gpus`).  The result is a `FleetStatus`, which
`render` prints as two rich tables and `FleetStatus.model_dump(mode="json")` gives to machines.
`playbooks/status.yml` builds the same JSON from the modules' results and renders it with
`sglfleet status --render -`, so both print the same table.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from sglfleet.fleet import _gpus as gpu_mod
from sglfleet.fleet import _health as health_mod
from sglfleet.fleet import _ledger as ledger_mod
from sglfleet.host import _systemd as systemd

DASH = "-"
EVIDENCE_WIDTH = 70
STATUS_STYLE = {"done": "green", "failed": "bold red", "pending": "yellow"}


class InstanceRow(BaseModel):
    """A health row plus the GPU memory of the instance's GPUs (summed over them; None when unknown)."""

    model_config = ConfigDict(frozen=True)

    health: health_mod.InstanceHealth
    gpu_memory_used_mib: int | None = None
    gpu_memory_total_mib: int | None = None
    #: Every GPU of the instance (CUDA_VISIBLE_DEVICES), more than one for a tensor-parallel instance.
    gpus: tuple[int, ...] = ()
    #: Why its memory is unknown although nvidia-smi ran: a GPU of it that no longer answers.
    gpu_problem: str | None = None


class GpuRow(BaseModel):
    """One GPU as nvidia-smi lists it, with the instances that use it."""

    model_config = ConfigDict(frozen=True)

    index: int
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    compute_processes: int
    instances: tuple[int, ...] = ()  # their ports


class FleetStatus(BaseModel):
    """Everything `sglfleet status` prints."""

    model_config = ConfigDict(frozen=True)

    ledger_path: str
    checklist: tuple[ledger_mod.ChecklistRow, ...]
    instances: tuple[InstanceRow, ...] = ()
    gpu_count: int | None = None
    nvidia_smi_found: bool | None = None
    gpus: tuple[GpuRow, ...] = ()
    #: What nvidia-smi said instead of a GPU's row (a GPU that fell off the bus), or why it failed.
    gpu_errors: tuple[str, ...] = ()
    #: No ledger file at `ledger_path`: no phase has recorded anything there (or it is the wrong path).
    ledger_missing: bool = False

    @property
    def failed_phases(self) -> list[str]:
        return [r.phase for r in self.checklist if r.status == "failed"]

    @property
    def healthy_count(self) -> int:
        return sum(r.health.healthy for r in self.instances)

    def summary(self) -> str:
        done = sum(r.status == "done" for r in self.checklist)
        failed = self.failed_phases
        phases = f"{done}/{len(self.checklist)} phases done" + (
            f", failed: {', '.join(failed)}" if failed else ""
        )
        if self.ledger_missing:
            phases += f" (no ledger at {self.ledger_path})"
        if not self.instances:
            return f"{phases}; no instances"
        if self.healthy_count == len(self.instances):
            return f"{phases}; all {len(self.instances)} instances healthy"
        return f"{phases}; {self.healthy_count}/{len(self.instances)} instances healthy"


def _sum(values: Sequence[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def join_gpu_memory(
    rows: Sequence[health_mod.InstanceHealth],
    facts: gpu_mod.GpuFacts | None,
    gpu_sets: Mapping[int, Sequence[int]] | None = None,
    gpu_errors: Sequence[str] = (),
) -> tuple[InstanceRow, ...]:
    """Attach the memory of each instance's GPUs (`gpu_sets` by port, else `row.gpu`) to its row.

    No facts -> no figures. With facts, a GPU of the instance that nvidia-smi did not list (while it
    listed others, or failed) makes the row name it: that GPU no longer answers nvidia-smi.
    """
    by_index = {g.index: g for g in facts.gpus} if facts else {}
    answered = facts is not None and facts.nvidia_smi_found
    detail = f" ({gpu_errors[0]})" if gpu_errors else ""
    out = []
    for row in rows:
        wanted = tuple((gpu_sets or {}).get(row.port) or ((row.gpu,) if row.gpu is not None else ()))
        found = [by_index[i] for i in wanted if i in by_index]
        missing = [i for i in wanted if i not in by_index]
        problem = None
        if answered and missing and (by_index or gpu_errors):
            names = ", ".join(str(i) for i in missing)
            problem = f"GPU {names} does not answer nvidia-smi{detail}"
        complete = found and not missing
        out.append(
            InstanceRow(
                health=row,
                gpu_memory_used_mib=_sum([g.memory_used_mib for g in found]) if complete else None,
                gpu_memory_total_mib=_sum([g.memory_total_mib for g in found]) if complete else None,
                gpus=wanted,
                gpu_problem=problem,
            )
        )
    return tuple(out)


def gpu_rows(facts: gpu_mod.GpuFacts | None, instances: Sequence[InstanceRow]) -> tuple[GpuRow, ...]:
    """One row per GPU nvidia-smi lists, with the ports of the instances on it."""
    if facts is None:
        return ()
    return tuple(
        GpuRow(
            index=g.index,
            name=g.name,
            memory_used_mib=g.memory_used_mib,
            memory_total_mib=g.memory_total_mib,
            compute_processes=len(g.processes),
            instances=tuple(r.health.port for r in instances if g.index in r.gpus),
        )
        for g in facts.gpus
    )


class FleetLayout(BaseModel):
    """The instances the sglang_fleet role configured, read back from its environment files."""

    model_config = ConfigDict(frozen=True)

    endpoints: tuple[health_mod.Endpoint, ...]
    api_key: str | None = None
    #: Every GPU of each instance, by port (CUDA_VISIBLE_DEVICES, "0,1" for a tensor-parallel one).
    gpu_sets: dict[int, tuple[int, ...]] = {}


def _env_file_values(path: Path) -> dict[str, str]:
    """The variables systemd starts the instance with; a line that is no assignment, or a quote left open,
    is an error here (the role writes neither), named with its file and line."""
    env_file = systemd.read_env_file(path)
    for ignored in env_file.ignored:
        if ignored.reason == systemd.NO_EQUALS:
            raise ValueError(f"{path}:{ignored.line}: not KEY=VALUE: {ignored.text!r}")
    if env_file.unterminated_quote is not None:
        raise ValueError(f"{path}:{env_file.unterminated_quote}: the quote opened here is not closed")
    return env_file.values


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def layout_from_env_dir(env_dir: str | Path) -> FleetLayout:
    """Read `instance-<i>.env` files (as the sglang_fleet role writes them): port, GPU, host, API key.

    The port comes from SGLANG_FLEET_PORT or `--port` in SGLANG_ARGS, the GPU from
    CUDA_VISIBLE_DEVICES, the host from `--host` (a wildcard address reads as 127.0.0.1), the API key
    from SGLANG_FLEET_API_KEY (or `--api-key` in SGLANG_ARGS).  No directory or no files: no instances.
    """
    path = Path(env_dir)
    files = sorted(path.glob("instance-*.env"), key=lambda f: (len(f.name), f.name)) if path.is_dir() else []
    endpoints, keys, gpu_sets = [], set(), {}
    for env_file in files:
        try:
            values = _env_file_values(env_file)
        except PermissionError:
            raise ValueError(
                f"{env_file}: cannot read it (mode 0600: run as root, or give --count/--url)"
            ) from None
        args = shlex.split(values.get("SGLANG_ARGS", ""))
        port_text = values.get("SGLANG_FLEET_PORT") or _flag(args, "--port")
        if not port_text or not port_text.isdigit():
            raise ValueError(f"{env_file}: no port (SGLANG_FLEET_PORT or --port in SGLANG_ARGS)")
        host = _flag(args, "--host") or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        # nvidia-smi's indices: the fleet's environment files set CUDA_DEVICE_ORDER=PCI_BUS_ID (_instances.py)
        words = [w.strip() for w in values.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        gpu_set = tuple(int(w) for w in words if w.isdigit())
        gpu = gpu_set[0] if gpu_set else None
        gpu_sets[int(port_text)] = gpu_set
        netloc = f"[{host}]" if ":" in host else host
        endpoints.append(
            health_mod.Endpoint(url=f"http://{netloc}:{port_text}", port=int(port_text), gpu=gpu)
        )
        # SGLANG_FLEET_API_KEY since the units start through sglfleet.launch; `--api-key` in older files.
        if key := values.get("SGLANG_FLEET_API_KEY") or _flag(args, "--api-key"):
            keys.add(key)
    return FleetLayout(
        endpoints=tuple(endpoints), api_key=keys.pop() if len(keys) == 1 else None, gpu_sets=gpu_sets
    )


def gather_status(
    *,
    ledger_path: str | Path = ledger_mod.DEFAULT_PATH,
    endpoints: Sequence[health_mod.Endpoint] = (),
    api_key: str | None = None,
    expected_model: str | None = None,
    timeout: float = health_mod.DEFAULT_TIMEOUT_S,
    gpu_facts: gpu_mod.GpuFacts | None = None,
    gpu_sets: Mapping[int, Sequence[int]] | None = None,
    gpu_errors: Sequence[str] = (),
) -> FleetStatus:
    """Read the ledger and probe `endpoints`; `gpu_facts` (when given) adds GPU memory, per GPU and per
    instance (`gpu_sets`: every GPU of each instance by port), and names the GPUs that do not answer."""
    ledger = ledger_mod.load_ledger(ledger_path)
    missing = not Path(ledger_path).exists()  # load_ledger reads a missing file as an empty ledger
    rows: list[health_mod.InstanceHealth] = []
    if endpoints:
        rows = list(
            health_mod.check_fleet(
                endpoints, api_key=api_key, expected_model=expected_model, timeout=timeout
            ).instances
        )
    instances = join_gpu_memory(rows, gpu_facts, gpu_sets, gpu_errors)
    return FleetStatus(
        ledger_path=str(ledger_path),
        checklist=tuple(ledger.checklist()),
        instances=instances,
        gpu_count=gpu_facts.gpu_count if gpu_facts else None,
        nvidia_smi_found=gpu_facts.nvidia_smi_found if gpu_facts else None,
        gpus=gpu_rows(gpu_facts, instances),
        gpu_errors=tuple(gpu_errors),
        ledger_missing=missing,
    )


def parse_status_json(text: str, source: str = "<stdin>") -> FleetStatus:
    """Read what `sglfleet status --json` printed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object")
    try:
        return FleetStatus.model_validate(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: not a fleet status: {exc}") from exc


def _when(time: datetime | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC") if time else DASH


def format_evidence(evidence: dict[str, Any], width: int = EVIDENCE_WIDTH) -> str:
    """`k=v, k=v` with lists and dicts as compact JSON, cut to `width` characters."""
    if not evidence:
        return DASH
    parts = []
    for key, value in evidence.items():
        shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={shown}")
    text = ", ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(value: float | int | None, fmt: str = "{}") -> str:
    return DASH if value is None else fmt.format(value)


def gigabytes(used_mib: int | None, total_mib: int | None) -> str:
    """`84.7 / 97.9 GB`: nvidia-smi's MiB in thousands, as the reference fleet's figures read."""
    if used_mib is None:
        return DASH
    if total_mib:
        return f"{used_mib / 1000:.1f} / {total_mib / 1000:.1f} GB"
    return f"{used_mib / 1000:.1f} GB"


def _memory(row: InstanceRow) -> Text:
    if row.gpu_problem:
        return Text("no answer", style="bold red")
    return Text(gigabytes(row.gpu_memory_used_mib, row.gpu_memory_total_mib))


def _gpus_cell(row: InstanceRow) -> str:
    if row.gpus:
        return ",".join(str(i) for i in row.gpus)
    return _num(row.health.gpu)


def _health_cell(row: health_mod.InstanceHealth) -> Text:
    if row.healthy:
        return Text(f"{row.status_code} healthy", style="green")
    reason = row.reason or "unhealthy"
    text = reason if row.status_code is None else f"{row.status_code} {reason}"
    return Text(text, style="bold red")


def checklist_table(status: FleetStatus) -> Table:
    table = Table(expand=False)
    for column in ("phase", "status", "when", "evidence"):
        table.add_column(column, no_wrap=column != "evidence")
    for row in status.checklist:
        table.add_row(
            row.phase,
            Text(row.status, style=STATUS_STYLE[row.status]),
            _when(row.time),
            format_evidence(row.evidence),
        )
    return table


def instance_table(status: FleetStatus) -> Table:
    table = Table(expand=False)
    for column in ("GPU", "port", "health", "model", "running", "waiting", "tokens/s", "GPU memory"):
        justify = "right" if column in ("GPU", "port", "running", "waiting", "tokens/s") else "left"
        table.add_column(column, justify=justify, no_wrap=True)
    for inst in status.instances:
        h = inst.health
        table.add_row(
            _gpus_cell(inst),
            str(h.port),
            _health_cell(h),
            h.model or DASH,
            _num(h.running_requests),
            _num(h.waiting_requests),
            _num(h.gen_throughput, "{:.1f}"),
            _memory(inst),
        )
    return table


def gpu_table(status: FleetStatus) -> Table:
    table = Table(expand=False)
    for column in ("GPU", "name", "memory", "compute processes", "instances (port)"):
        table.add_column(column, justify="right" if column == "GPU" else "left", no_wrap=True)
    for gpu in status.gpus:
        table.add_row(
            str(gpu.index),
            gpu.name,
            gigabytes(gpu.memory_used_mib, gpu.memory_total_mib),
            str(gpu.compute_processes),
            ", ".join(str(p) for p in gpu.instances) or DASH,
        )
    return table


def render(status: FleetStatus, console: Console) -> None:
    """Print the checklist, the instance table, and the one-line summary."""
    n = len(status.instances)
    console.print(
        Group(
            Text(f"Phases ({status.ledger_path})", style="bold")
            if not status.ledger_missing
            else Text.assemble(
                (f"Phases ({status.ledger_path}: ", "bold"),
                ("missing", "bold red"),
                (")", "bold"),
                "\n  no phase has recorded anything in this file: is this the fleet host, and the "
                "ledger path (--ledger) right? Every phase is shown pending.",
            ),
            checklist_table(status),
            Text(""),
            Text(
                f"Instances ({status.healthy_count}/{n} healthy)" if n else "Instances (none configured)",
                style="bold",
            ),
            instance_table(status),
        ),
        overflow="ignore",
        crop=False,
    )
    unhealthy = [i.health for i in status.instances if not i.health.healthy and i.health.detail]
    for h in unhealthy:
        console.print(f"  {h.url}: {h.detail}", style="red")
    for inst in status.instances:
        if inst.gpu_problem:
            console.print(
                f"  {inst.health.url}: {inst.gpu_problem}", style="red", overflow="ignore", crop=False
            )
    if status.gpus or status.gpu_errors:
        console.print(Text(f"GPUs ({len(status.gpus)} answer nvidia-smi)", style="bold"))
        console.print(gpu_table(status), overflow="ignore", crop=False)
        for error in status.gpu_errors:
            console.print(f"  nvidia-smi: {error}", style="red", overflow="ignore", crop=False)
    console.print(status.summary())
