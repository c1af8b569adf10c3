"""Running the server the way `python -m sglang.launch_server` (0.5.12) runs: the same start and
stop sequence, with the model load and the warm-up reduced to --standin-* durations.

Start (sglang/srt/entrypoints/http_server.py:2315-2360 launch_server): log the server arguments,
load the model (nothing listens yet: connections are refused), then listen; /health* answer 503
until the warm-up request is done, then run their 1-token check.

SIGTERM (managers/tokenizer_manager.py:1635, 2375-2411, 2802-2806): keep listening and serving
(new requests too), /health* answer 503; every 5 s look at the requests left, and once none is left
SIGKILL the process itself (utils/common.py:1184-1186). There is no drain timeout of its own: the
service manager's stop timeout is the only limit.

SIGINT (uvicorn's own handler): stop listening, let in-flight requests finish, exit 0.

A forward batch stalled longer than --watchdog-timeout (the hang fault, --standin-hang-after): the
scheduler's watchdog SIGQUITs the main process, which SIGKILLs itself (standin/watchdog.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from aiohttp import web

from sglfleet_testing.standin import watchdog as scheduler_watchdog
from sglfleet_testing.standin.app import StandinApp
from sglfleet_testing.standin.config import StandinConfig

log = logging.getLogger("sglfleet_testing.standin")
# SGLang's log line shape (sglang/srt/server_args.py:7750-7755 and utils/common.py:1264-1271).
LOG_FORMAT = "[%(asctime)s] %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
# What uvicorn gives in-flight requests after SIGINT; the stand-in's bound.
SIGINT_GRACE_SECONDS = 60.0


def serve(config: StandinConfig) -> int:
    """Serve until SIGTERM (drain, then SIGKILL of itself, as SGLang) or SIGINT (exit 0);
    1 when the address cannot be bound."""
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT, datefmt=LOG_DATEFMT, force=True)
    # sglang/srt/entrypoints/engine.py:773, the key in clear: the launcher (sglfleet.launch) redacts it.
    log.info("server_args=%s", config.server_args_repr())
    if config.load_seconds:
        log.info("Load weight begin (stand-in: %.1f s, nothing listens meanwhile).", config.load_seconds)
        time.sleep(config.load_seconds)
        log.info("Load weight end.")
    try:
        asyncio.run(_run(config))
    except OSError as error:
        log.error("cannot serve on %s:%d: %s", config.host, config.port, error)
        return 1
    log.info("SGLang stand-in stopped")
    return 0


async def _run(config: StandinConfig) -> None:
    state = StandinApp(config)
    runner = web.AppRunner(
        state.build(),
        handle_signals=False,
        access_log=logging.getLogger("aiohttp.access") if config.log_level == "debug" else None,
        handler_cancellation=True,  # a client that hangs up aborts its request, as in SGLang
        shutdown_timeout=SIGINT_GRACE_SECONDS,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
        log.info(
            "SGLang stand-in serving %s on http://%s:%d (max_running_requests=%s)",
            config.model_name,
            config.host,
            config.port,
            config.max_running_requests,
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, state.sigterm_handler)
        # The scheduler's watchdog and the main process's SIGQUIT handler (standin/watchdog.py).
        loop.add_signal_handler(signal.SIGQUIT, scheduler_watchdog.sigquit_handler)
        engine = state.engine
        scheduler_watchdog.watch(config.watchdog_timeout, lambda: engine.forward_ct, lambda: engine.busy)
        watchdog = loop.create_task(state.sigterm_watchdog())
        await stop.wait()
        watchdog.cancel()
    finally:
        await runner.cleanup()
