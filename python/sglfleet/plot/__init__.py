"""Pictures (the `plot` extra, matplotlib): the category shares before and after a mix or a merge, and
a generation job's progress and throughput over time (`sglfleet job report`).

Importing a name imports matplotlib: without the extra that is an ImportError naming it, which the CLI
turns into "install the plot extra: pip install 'sglfleet[plot]'".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglfleet._lazy import attach

# The public names, each written once (sglfleet._lazy reads this block).
if TYPE_CHECKING:
    from sglfleet.plot._charts import job_chart, job_series, shares_chart

__getattr__, __dir__, __all__ = attach(__name__, __file__)
