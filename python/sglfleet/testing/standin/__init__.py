"""The SGLang stand-in: a real HTTP server speaking SGLang 0.5.12's API without a GPU.

Run it as ``python -m sglfleet.testing.standin --model-path M --port P`` (the flags of
``sglang.launch_server`` plus ``--standin-*`` knobs for latency and faults). Tests start one
with :func:`sglfleet.testing.standin.process.running_standin`.
"""

from sglfleet.testing.standin.config import StandinConfig

SGLANG_VERSION = "0.5.12"

__all__ = ["SGLANG_VERSION", "StandinConfig"]
