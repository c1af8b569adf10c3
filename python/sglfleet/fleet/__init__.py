"""The fleet: GPUs, instance health, the phase ledger, and the status view that joins them.

- `gpus`: what nvidia-smi says of the GPUs and of the processes holding them.
- `health`: probe SGLang instances (`/health_generate`, `/model_info`, `/v1/loads`).
- `ledger`: the per-host record of each phase's outcome (`/var/lib/sglfleet/ledger.json`).
- `status`: the checklist and the instance table `sglfleet status` prints.
- `backend`: the attention backend and torch's CUDA runtime for a host's compute capability.
- `instances`: lay out the SGLang instances, observe the host, plan what to start, roll and retire.
- `training`: find the training job (its units and matching processes) that holds the GPUs.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import exports

if TYPE_CHECKING:
    from sglfleet.fleet._backend import ATTENTION_BACKENDS
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
    from sglfleet.fleet._instances import FleetSpec, GpuInventory, InstanceSpec
    from sglfleet.fleet._instances_observe import Observed, observe
    from sglfleet.fleet._instances_plan import Plan, plan, write_env_files
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
    from sglfleet.fleet._training import TrainingJob, TrainingProcess, TrainingUnit, discover

# Each name's submodule is imported when the name is first used (sglfleet._lazy).
_EXPORTS = {
    "ComputeProcess": "_gpus",
    "Gpu": "_gpus",
    "GpuFacts": "_gpus",
    "GpuQueryError": "_gpus",
    "query_gpus": "_gpus:query",
    "Endpoint": "_health",
    "FleetHealth": "_health",
    "InstanceHealth": "_health",
    "check_fleet": "_health",
    "endpoint_from_url": "_health",
    "endpoints_from_range": "_health",
    "endpoints_from_urls": "_health",
    "ATTENTION_BACKENDS": "_backend",
    "FleetSpec": "_instances",
    "GpuInventory": "_instances",
    "InstanceSpec": "_instances",
    "Observed": "_instances_observe",
    "Plan": "_instances_plan",
    "observe": "_instances_observe",
    "plan": "_instances_plan",
    "write_env_files": "_instances_plan",
    "PHASES": "_ledger",
    "STATUSES": "_ledger",
    "Ledger": "_ledger",
    "LedgerError": "_ledger",
    "PhaseRecord": "_ledger",
    "load_ledger": "_ledger",
    "record_phase": "_ledger",
    "remove_phase": "_ledger",
    "FleetStatus": "_status",
    "gather_status": "_status",
    "render": "_status",
    "TrainingJob": "_training",
    "TrainingProcess": "_training",
    "TrainingUnit": "_training",
    "discover": "_training",
}

__all__ = [
    "ATTENTION_BACKENDS",
    "PHASES",
    "STATUSES",
    "ComputeProcess",
    "Endpoint",
    "FleetHealth",
    "FleetSpec",
    "FleetStatus",
    "Gpu",
    "GpuFacts",
    "GpuInventory",
    "GpuQueryError",
    "InstanceHealth",
    "InstanceSpec",
    "Ledger",
    "LedgerError",
    "Observed",
    "PhaseRecord",
    "Plan",
    "TrainingJob",
    "TrainingProcess",
    "TrainingUnit",
    "check_fleet",
    "discover",
    "endpoint_from_url",
    "endpoints_from_range",
    "endpoints_from_urls",
    "gather_status",
    "load_ledger",
    "observe",
    "plan",
    "query_gpus",
    "record_phase",
    "remove_phase",
    "render",
    "write_env_files",
]

__getattr__ = exports(__name__, _EXPORTS)
