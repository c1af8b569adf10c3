"""The SGLang stand-in: a real HTTP server speaking SGLang 0.5.12's API without a GPU.

Run it as ``python -m sglfleet_testing.standin --model-path M --port P`` (the flags of
``sglang.launch_server`` plus ``--standin-*`` knobs for latency and faults). Tests start one
with :func:`sglfleet_testing.standin.process.running_standin`.
"""

from sglfleet_testing.standin.config import StandinConfig

SGLANG_VERSION = "0.5.12"

__all__ = ["SGLANG_VERSION", "StandinConfig"]
