"""Running the server: bind, serve until SIGTERM/SIGINT, drain in-flight requests, exit 0."""

from __future__ import annotations

import logging

from aiohttp import web

from sglfleet.testing.standin.app import build_app
from sglfleet.testing.standin.config import StandinConfig

log = logging.getLogger("sglfleet.testing.standin")


def serve(config: StandinConfig) -> int:
    """Serve until a signal; in-flight requests get up to --watchdog-timeout seconds to finish."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
    )
    log.info(
        "SGLang stand-in serving %s on http://%s:%d (max_running_requests=%s)",
        config.model_name,
        config.host,
        config.port,
        config.max_running_requests,
    )
    web.run_app(
        build_app(config),
        host=config.host,
        port=config.port,
        shutdown_timeout=config.watchdog_timeout,
        access_log=logging.getLogger("aiohttp.access") if config.log_level == "debug" else None,
        print=None,
        handle_signals=True,
    )
    log.info("SGLang stand-in stopped")
    return 0
