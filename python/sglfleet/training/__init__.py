"""The training job that shares the GPUs with the fleet: find it, hand it the merged set, start it again.

- `training`: find the training job (its systemd units and the processes matching patterns) that holds
  the GPUs, and what of a stopped job still runs (phase training_stop, module `training_jobs`).
- `resume`: back to training: install the merged set (`install_dataset`), drain the fleet (`fleet_plan`),
  wait for free GPUs (`gpus_not_free`), start the job again (`launch_plan`) and look at it (`look`)
  (phase training_resume, modules `training_dataset`, `fleet_drain`, `training_launch`).

It reads the host through `sglfleet.host` and the fleet's instances through `sglfleet.fleet`.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.training._resume import (
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
        look,
    )
    from sglfleet.training._training import (
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

__getattr__, __dir__, __all__ = attach(__name__, __file__)
