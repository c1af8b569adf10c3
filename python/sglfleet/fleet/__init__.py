"""The fleet: GPUs, instance health, the phase ledger, and the status view that joins them.

- `gpus`: what nvidia-smi says of the GPUs and of the processes holding them.
- `health`: probe SGLang instances (`/health_generate`, `/model_info`, `/v1/loads`).
- `ledger`: the per-host record of each phase's outcome (`/var/lib/sglfleet/ledger.json`).
- `status`: the checklist and the instance table `sglfleet status` prints.
- `backend`: the attention backend and torch's CUDA runtime for a host's compute capability.
- `instances`: lay out the SGLang instances, observe the host, plan what to start, roll and retire.
- `wheels`: what the pinned SGLang wheels need of the interpreter and glibc (`install_problems`).
- `router`: take instances out of SGLang's router (`/workers`) before they stop, put them back after.
- `training`: find the training job (its units and matching processes) that holds the GPUs.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.fleet._backend import ATTENTION_BACKENDS, BackendError, Decision, observe_torch_cuda
    from sglfleet.fleet._backend import decide as decide_backend
    from sglfleet.fleet._defaults import DEFAULT_INTERVAL_S as HEALTH_INTERVAL_S
    from sglfleet.fleet._defaults import DEFAULT_PATH as LEDGER_PATH
    from sglfleet.fleet._defaults import DEFAULT_TIMEOUT_S as HEALTH_TIMEOUT_S
    from sglfleet.fleet._endpoints import EndpointError
    from sglfleet.fleet._endpoints import from_ledgers as endpoints_from_ledgers
    from sglfleet.fleet._gpus import (
        ComputeProcess,
        Gpu,
        GpuFacts,
        GpuQueryError,
        combine,
        find_nvidia_smi,
        parse_compute_apps,
        parse_gpus,
    )
    from sglfleet.fleet._gpus import query as query_gpus
    from sglfleet.fleet._gpus import query_tolerant as query_gpus_tolerant
    from sglfleet.fleet._health import (
        Endpoint,
        FleetHealth,
        InstanceHealth,
        check_fleet,
        endpoint_from_url,
        endpoints_from_range,
        endpoints_from_urls,
        parse_loads,
        probe_fleet_async,
    )
    from sglfleet.fleet._instances import FleetSpec, GpuInventory, InstanceSpec, problems
    from sglfleet.fleet._instances_observe import Observed, observe
    from sglfleet.fleet._instances_plan import Plan, plan, write_env_files
    from sglfleet.fleet._ledger import (
        OPTIONAL_PHASES,
        PHASES,
        STATUSES,
        Ledger,
        LedgerError,
        PhaseRecord,
        load_ledger,
        record_phase,
        remove_phase,
    )
    from sglfleet.fleet._resume import (
        DROPIN_NAME,
        OLD_DROPIN_NAMES,
        ResumeError,
        dataset_state,
        environment_problems,
        file_digest,
        fleet_plan,
        gpus_not_free,
        install_dataset,
        launch_plan,
        loaded_rows,
    )
    from sglfleet.fleet._resume import look as look_training
    from sglfleet.fleet._router import RouterError, RouterWorker, RouterWorkers
    from sglfleet.fleet._status import (
        FleetStatus,
        gather_status,
        instance_table,
        join_gpu_memory,
        layout_from_env_dir,
        parse_status_json,
        render,
    )
    from sglfleet.fleet._training import (
        LAUNCHER_KILL_AFTER_S,
        PatternError,
        TrainingJob,
        TrainingProcess,
        TrainingUnit,
        checkpoint_time_warnings,
        compile_patterns,
        discover,
        matching_processes,
        signal_number,
        still_alive,
        stop_settings_problems,
    )
    from sglfleet.fleet._wheels import WHEELS, WheelNeed, install_problems, wheel_needs

__getattr__, __dir__, __all__ = attach(__name__, __file__)
