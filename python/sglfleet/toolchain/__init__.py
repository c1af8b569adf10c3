"""Role cuda_toolchain's decisions, out of Jinja.

- `_verify`: what the verification's checks printed → one verdict per check (passed, or the message that
  names the cause and the repairing task) and the wheels that drifted from the release's pins
  (`toolchain_verdicts`, `toolchain_drift`); module `toolchain_verdict` is its adapter.
"""

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once: a name's submodule is imported when the name is first used
# (sglfleet._lazy reads this block; type checkers and readers see plain imports).
if TYPE_CHECKING:
    from sglfleet.toolchain._verify import CHECKS as TOOLCHAIN_CHECKS
    from sglfleet.toolchain._verify import FIX_TASKS as TOOLCHAIN_FIX_TASKS
    from sglfleet.toolchain._verify import Check, ToolchainFacts
    from sglfleet.toolchain._verify import drift as toolchain_drift
    from sglfleet.toolchain._verify import verdicts as toolchain_verdicts

__getattr__, __dir__, __all__ = attach(__name__, __file__)
