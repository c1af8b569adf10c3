"""A generation job's endpoints from the fleet hosts' ledgers (sglfleet.fleet._endpoints, module
fleet_endpoints): every port phase fleet recorded, at each host's address, in host order; a host that has
not served is named and nothing is returned."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module

from sglfleet.fleet import EndpointError, endpoints_from_ledgers, load_ledger, record_phase


def served(tmp_path: Path, name: str, ports: list[int], model: str = "target", status: str = "done") -> dict:
    """The ledger of a host whose phase fleet recorded `ports`, as fleet_ledger state=read returns it."""
    path = tmp_path / f"{name}.json"
    record_phase(path, "fleet", status, {"instances": len(ports), "ports": ports, "model": model})
    return load_ledger(path).model_dump(mode="json")


def test_every_recorded_port_of_every_host_in_host_order(tmp_path: Path) -> None:
    ledgers = {
        "ct200": served(tmp_path, "a", [30000, 30001, 30002, 30003, 30004, 30005, 30006, 30007], "big"),
        "ct201": served(tmp_path, "b", [31000, 31001, 31002, 31003], "small"),
    }
    found = endpoints_from_ledgers(ledgers, {"ct200": "10.0.0.5"})
    assert len(found.urls) == 12
    assert found.urls[:2] == ("http://10.0.0.5:30000", "http://10.0.0.5:30001")
    # a host without an address is reached by its name
    assert found.hosts["ct201"] == tuple(f"http://ct201:{p}" for p in range(31000, 31004))
    assert found.model == "big"
    reordered = endpoints_from_ledgers({"ct201": ledgers["ct201"], "ct200": ledgers["ct200"]})
    assert reordered.urls[0] == "http://ct201:31000" and reordered.model == "small"


def test_a_host_that_has_not_served_is_named(tmp_path: Path) -> None:
    path = tmp_path / "prompts-only.json"
    record_phase(path, "prompts", "done", {"prompts": 3})
    ledgers = {
        "ct200": served(tmp_path, "a", [30000]),
        "ct201": load_ledger(path).model_dump(mode="json"),
        "ct202": served(tmp_path, "c", [30000], status="failed"),
    }
    with pytest.raises(EndpointError) as err:
        endpoints_from_ledgers(ledgers, ledger_path="/var/lib/sglfleet/ledger.json")
    assert str(err.value) == (
        "phase fleet is not done on ct201, ct202 (its ledger /var/lib/sglfleet/ledger.json records no "
        "ports): run playbooks/fleet.yml first, or list the instances in generate_endpoints"
    )


def test_no_port_at_all_is_no_endpoint(tmp_path: Path) -> None:
    with pytest.raises(EndpointError, match="no endpoint to send to"):
        endpoints_from_ledgers({"ct200": served(tmp_path, "a", [])})
    with pytest.raises(EndpointError, match="no endpoint to send to"):
        endpoints_from_ledgers({})


def test_module_returns_the_endpoints_and_names_a_host_without_a_record(tmp_path: Path) -> None:
    ledgers = {"ct200": served(tmp_path, "a", [30000, 30001], "/models/target")}
    for check in (False, True):
        result = run_module(
            "fleet_endpoints", {"ledgers": ledgers, "addresses": {"ct200": "10.9.8.7"}}, tmp_path, check=check
        )
        assert not result.get("failed"), result
        assert result["changed"] is False
        assert result["endpoints"] == ["http://10.9.8.7:30000", "http://10.9.8.7:30001"]
        assert result["model"] == "/models/target"
    empty = run_module("fleet_endpoints", {"ledgers": {**ledgers, "ct201": {}}}, tmp_path)
    assert empty["failed"] and "phase fleet is not done on ct201" in empty["msg"]
    bad = run_module("fleet_endpoints", {"ledgers": {"ct200": {"phases": {"deploy": {}}}}}, tmp_path)
    assert bad["failed"] and bad["msg"].startswith("ledgers: not the ledgers fleet_ledger state=read returns")


def test_module_documentation_renders() -> None:
    doc = module_doc("fleet_endpoints")
    assert_examples_use_documented_options("fleet_endpoints", doc)
