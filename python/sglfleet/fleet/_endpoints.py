"""The endpoints of a generation job: every instance of every fleet host, from what phase fleet recorded.

Phase fleet records the ports it serves on in each fleet host's ledger (`evidence.ports`, and the model
in `evidence.model`). A generation job sends to exactly those: a host with 4 GPUs gives 4 endpoints and
one with 8 gives 8; nothing is assumed. A host whose ledger has no such record (or records phase fleet
as not done) is named, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from sglfleet.fleet._ledger import Ledger

__all__ = ["EndpointError", "from_ledgers"]


class EndpointError(ValueError):
    """The fleet hosts' ledgers give no endpoints to send to; the message names the hosts and the fix."""


class FleetEndpoints(BaseModel):
    """The base URLs of the instances, by host in the order given, and the model the first host serves."""

    model_config = ConfigDict(frozen=True)

    urls: tuple[str, ...]
    model: str
    hosts: Mapping[str, tuple[str, ...]]


def not_served(ledgers: Mapping[str, Ledger]) -> list[str]:
    """The hosts whose ledger records no ports for phase fleet, then those that record it as not done."""
    no_ports = [host for host, lg in ledgers.items() if "ports" not in _fleet_evidence(lg)]
    not_done = [
        host
        for host, lg in ledgers.items()
        if (record := lg.phases.get("fleet")) is not None and record.status != "done"
    ]
    return no_ports + not_done


def from_ledgers(
    ledgers: Mapping[str, Ledger | Mapping[str, Any]],
    addresses: Mapping[str, str] | None = None,
    *,
    ledger_path: str = "/var/lib/sglfleet/ledger.json",
) -> FleetEndpoints:
    """`http://<address>:<port>` for every port phase fleet recorded on each host (`addresses` maps a host
    to the address its instances answer at; the host's name otherwise).

    `ledgers` maps each fleet host to its ledger (a Ledger, or the JSON `fleet_ledger state=read` returns).
    Raises EndpointError when a host has not served phase fleet, or when no host records a port.
    """
    parsed = {
        host: lg if isinstance(lg, Ledger) else Ledger.model_validate(lg) for host, lg in ledgers.items()
    }
    bad = not_served(parsed)
    if bad:
        raise EndpointError(
            f"phase fleet is not done on {', '.join(bad)} (its ledger {ledger_path} records no ports): run "
            "playbooks/fleet.yml first, or list the instances in generate_endpoints"
        )
    addresses = addresses or {}
    hosts = {
        host: tuple(f"http://{addresses.get(host) or host}:{port}" for port in _fleet_evidence(lg)["ports"])
        for host, lg in parsed.items()
    }
    urls = tuple(url for host_urls in hosts.values() for url in host_urls)
    if not urls:
        raise EndpointError(
            "no endpoint to send to: the fleet phase recorded no ports and generate_endpoints is empty"
        )
    first = next(iter(parsed.values()))
    return FleetEndpoints(urls=urls, model=str(_fleet_evidence(first).get("model", "")), hosts=hosts)


def _fleet_evidence(ledger: Ledger) -> dict[str, Any]:
    record = ledger.phases.get("fleet")
    return record.evidence if record is not None else {}
