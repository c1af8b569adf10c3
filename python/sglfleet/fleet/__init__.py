"""The fleet: GPUs, instance health, the phase ledger, and the status view that joins them.

- `gpus`: what nvidia-smi says of the GPUs and of the processes holding them.
- `health`: probe SGLang instances (`/health_generate`, `/model_info`, `/v1/loads`).
- `ledger`: the per-host record of each phase's outcome (`/var/lib/sglfleet/ledger.json`).
- `status`: the checklist and the instance table `sglfleet status` prints.
"""

from sglfleet.fleet._gpus import ComputeProcess, Gpu, GpuFacts, GpuQueryError
from sglfleet.fleet._gpus import query as query_gpus
from sglfleet.fleet._health import (
    Endpoint,
    FleetHealth,
    InstanceHealth,
    check_fleet,
    endpoint_from_url,
    endpoints_from_range,
    endpoints_from_urls,
)
from sglfleet.fleet._ledger import (
    PHASES,
    STATUSES,
    Ledger,
    LedgerError,
    PhaseRecord,
    load_ledger,
    record_phase,
    remove_phase,
)
from sglfleet.fleet._status import FleetStatus, gather_status, render

__all__ = [
    "PHASES",
    "STATUSES",
    "ComputeProcess",
    "Endpoint",
    "FleetHealth",
    "FleetStatus",
    "Gpu",
    "GpuFacts",
    "GpuQueryError",
    "InstanceHealth",
    "Ledger",
    "LedgerError",
    "PhaseRecord",
    "check_fleet",
    "endpoint_from_url",
    "endpoints_from_range",
    "endpoints_from_urls",
    "gather_status",
    "load_ledger",
    "query_gpus",
    "record_phase",
    "remove_phase",
    "render",
]
