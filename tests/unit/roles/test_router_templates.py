"""Role sglang_router's templates: the router's health-check and grace-period flags come from the role's
variables, 0.3.2's own argument parser accepts them, and the unit's TimeoutStopSec outlasts the grace
period it is derived from (one variable, both places)."""

from __future__ import annotations

import argparse
import shlex

import jinja2
import pytest
import yaml
from support.paths import REPO

ROLE = REPO / "roles" / "sglang_router"


def _render(name: str, **overrides: object) -> str:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    values = {
        **{k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)},
        "sglang_router_model_path": "/srv/models/m",
        "sglang_router_api_key": "",
        "__sglang_router_workers": ["http://10.0.0.7:30000", "http://10.0.0.7:30001"],
        **overrides,
    }
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string((ROLE / "templates" / name).read_text()).render(**values)


def _router_args(text: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ROUTER_ARGS=")]
    return shlex.split(shlex.split(line.removeprefix("ROUTER_ARGS="))[0])


def test_the_health_flags_come_from_the_role_and_the_router_takes_them() -> None:
    argv = _router_args(_render("router.env.j2", sglang_router_health_check_interval_secs=7))
    flags = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--health") or "grace" in a}
    assert flags["--health-check-interval-secs"] == "7"
    assert flags["--health-failure-threshold"] == "2"
    assert flags["--health-check-timeout-secs"] == "5"
    assert flags["--shutdown-grace-period-secs"] == "180"
    router_args = pytest.importorskip("sglang_router.router_args", reason="sglang-router is not installed")
    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser)
    parsed = router_args.RouterArgs.from_cli_args(parser.parse_args(argv))
    assert (
        parsed.health_check_interval_secs,
        parsed.health_failure_threshold,
        parsed.health_check_timeout_secs,
        parsed.shutdown_grace_period_secs,
    ) == (7, 2, 5, 180)


def test_systemd_waits_longer_than_the_routers_grace_period() -> None:
    unit = _render("sglang-router.service.j2", sglang_router_shutdown_grace_period_secs=300)
    assert "TimeoutStopSec=315" in unit.splitlines()
    args = _router_args(_render("router.env.j2", sglang_router_shutdown_grace_period_secs=300))
    assert args[args.index("--shutdown-grace-period-secs") + 1] == "300"
