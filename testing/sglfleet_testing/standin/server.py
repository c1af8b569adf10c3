"""Running the server: bind, serve until SIGTERM/SIGINT, drain in-flight requests, exit 0."""

from __future__ import annotations

import logging

from aiohttp import web

from sglfleet_testing.standin.app import build_app
from sglfleet_testing.standin.config import StandinConfig

log = logging.getLogger("sglfleet_testing.standin")


def serve(config: StandinConfig) -> int:
    """Serve until SIGTERM/SIGINT (exit code 0), in-flight requests getting up to --watchdog-timeout
    seconds to finish; 1 when the address cannot be bound."""
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
    try:
        _run(config)
    except OSError as error:
        log.error("cannot serve on %s:%d: %s", config.host, config.port, error)
        return 1
    log.info("SGLang stand-in stopped")
    return 0


def _run(config: StandinConfig) -> None:
    web.run_app(
        build_app(config),
        host=config.host,
        port=config.port,
        shutdown_timeout=config.watchdog_timeout,
        access_log=logging.getLogger("aiohttp.access") if config.log_level == "debug" else None,
        print=None,
        handle_signals=True,
        handler_cancellation=True,  # a client that hangs up aborts its request, as in SGLang
    )
