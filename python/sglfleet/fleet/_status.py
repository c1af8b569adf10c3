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
from collections.abc import Sequence
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

DASH = "-"
EVIDENCE_WIDTH = 70
STATUS_STYLE = {"done": "green", "failed": "bold red", "pending": "yellow"}


class InstanceRow(BaseModel):
    """A health row plus the GPU memory of the instance's GPU (when known)."""

    model_config = ConfigDict(frozen=True)

    health: health_mod.InstanceHealth
    gpu_memory_used_mib: int | None = None
    gpu_memory_total_mib: int | None = None


class FleetStatus(BaseModel):
    """Everything `sglfleet status` prints."""

    model_config = ConfigDict(frozen=True)

    ledger_path: str
    checklist: tuple[ledger_mod.ChecklistRow, ...]
    instances: tuple[InstanceRow, ...] = ()
    gpu_count: int | None = None
    nvidia_smi_found: bool | None = None

    @property
    def healthy_count(self) -> int:
        return sum(r.health.healthy for r in self.instances)

    def summary(self) -> str:
        done = sum(r.status == "done" for r in self.checklist)
        failed = [r.phase for r in self.checklist if r.status == "failed"]
        phases = f"{done}/{len(self.checklist)} phases done" + (
            f", failed: {', '.join(failed)}" if failed else ""
        )
        if not self.instances:
            return f"{phases}; no instances"
        if self.healthy_count == len(self.instances):
            return f"{phases}; all {len(self.instances)} instances healthy"
        return f"{phases}; {self.healthy_count}/{len(self.instances)} instances healthy"


def join_gpu_memory(
    rows: Sequence[health_mod.InstanceHealth], facts: gpu_mod.GpuFacts | None
) -> tuple[InstanceRow, ...]:
    """Attach the memory of GPU `row.gpu` to each row; unknown GPU or no facts -> no figures."""
    by_index = {g.index: g for g in facts.gpus} if facts else {}
    out = []
    for row in rows:
        gpu = by_index.get(row.gpu) if row.gpu is not None else None
        out.append(
            InstanceRow(
                health=row,
                gpu_memory_used_mib=gpu.memory_used_mib if gpu else None,
                gpu_memory_total_mib=gpu.memory_total_mib if gpu else None,
            )
        )
    return tuple(out)


class FleetLayout(BaseModel):
    """The instances the sglang_fleet role configured, read back from its environment files."""

    model_config = ConfigDict(frozen=True)

    endpoints: tuple[health_mod.Endpoint, ...]
    api_key: str | None = None


def _env_file_values(path: Path) -> dict[str, str]:
    values = {}
    for line_no, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{line_no}: not KEY=VALUE: {raw!r}")
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"{path}:{line_no}: {key}: {exc}") from None
        values[key.strip()] = " ".join(words)
    return values


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
    endpoints, keys = [], set()
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
        gpu_text = values.get("CUDA_VISIBLE_DEVICES", "")
        gpu = int(gpu_text) if gpu_text.isdigit() else None
        netloc = f"[{host}]" if ":" in host else host
        endpoints.append(
            health_mod.Endpoint(url=f"http://{netloc}:{port_text}", port=int(port_text), gpu=gpu)
        )
        # SGLANG_FLEET_API_KEY since the units start through sglfleet.launch; `--api-key` in older files.
        if key := values.get("SGLANG_FLEET_API_KEY") or _flag(args, "--api-key"):
            keys.add(key)
    return FleetLayout(endpoints=tuple(endpoints), api_key=keys.pop() if len(keys) == 1 else None)


def gather_status(
    *,
    ledger_path: str | Path = ledger_mod.DEFAULT_PATH,
    endpoints: Sequence[health_mod.Endpoint] = (),
    api_key: str | None = None,
    expected_model: str | None = None,
    timeout: float = health_mod.DEFAULT_TIMEOUT_S,
    gpu_facts: gpu_mod.GpuFacts | None = None,
) -> FleetStatus:
    """Read the ledger and probe `endpoints`; `gpu_facts` (when given) adds GPU memory."""
    ledger = ledger_mod.load_ledger(ledger_path)
    rows: list[health_mod.InstanceHealth] = []
    if endpoints:
        rows = list(
            health_mod.check_fleet(
                endpoints, api_key=api_key, expected_model=expected_model, timeout=timeout
            ).instances
        )
    return FleetStatus(
        ledger_path=str(ledger_path),
        checklist=tuple(ledger.checklist()),
        instances=join_gpu_memory(rows, gpu_facts),
        gpu_count=gpu_facts.gpu_count if gpu_facts else None,
        nvidia_smi_found=gpu_facts.nvidia_smi_found if gpu_facts else None,
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


def _memory(row: InstanceRow) -> str:
    if row.gpu_memory_used_mib is None:
        return DASH
    if row.gpu_memory_total_mib:
        return f"{row.gpu_memory_used_mib} / {row.gpu_memory_total_mib} MiB"
    return f"{row.gpu_memory_used_mib} MiB"


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
            _num(h.gpu),
            str(h.port),
            _health_cell(h),
            h.model or DASH,
            _num(h.running_requests),
            _num(h.waiting_requests),
            _num(h.gen_throughput, "{:.1f}"),
            _memory(inst),
        )
    return table


def render(status: FleetStatus, console: Console) -> None:
    """Print the checklist, the instance table, and the one-line summary."""
    n = len(status.instances)
    console.print(
        Group(
            Text(f"Phases ({status.ledger_path})", style="bold"),
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
    console.print(status.summary())
