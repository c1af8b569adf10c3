"""docs/grafana/sglfleet.json names only metrics that are really served: every series an expression
reads is one that a running `sglfleet generate --metrics-port` or the SGLang stand-in's `/metrics`
(the names SGLang 0.5.12 serves, cited in sglfleet_testing/standin/metrics.py) exposes, scraped here;
and every family the job serves has a panel."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support.generate import fleet, generate_argv, write_batch
from support.paths import REPO
from support.polling import wait_until

pytestmark = pytest.mark.timeout(90)
DASHBOARD = REPO / "docs" / "grafana" / "sglfleet.json"
# PromQL words that are not series: grouping and matching keywords, set operators
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
}


def metric_names(expr: str) -> set[str]:
    """The series an expression reads: identifiers left once strings, label matchers, ranges and
    grouping clauses are taken out, less functions (followed by a parenthesis) and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def served(exposition: str) -> set[str]:
    """The sample names of a Prometheus text exposition (histograms' _bucket, _sum, _count included)."""
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in exposition.splitlines() if line and line[0] != "#"
    }


def expressions() -> list[str]:
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    """(what a job's --metrics-port serves after its end, what the stand-in serves after answering it)."""
    tmp = tmp_path_factory.mktemp("grafana")
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    write_batch(inp, 6)
    with fleet({"standin_ttft": 0.01}) as servers:
        url = servers[0].base_url
        argv = generate_argv(inp, out, [url], "--metrics-port", "0", "--metrics-linger", "60")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            match = re.search(r"metrics on (http://\S+/metrics)", proc.stderr.readline())  # type: ignore[union-attr]
            assert match
            job: list[str] = []
            wait_until(
                lambda: "sglfleet_generate_exit_code" in (job.append(_get(match.group(1))) or job[-1]),
                timeout=60,
                what="the job's end in its metrics",
            )
        finally:
            proc.terminate()  # ends the linger
            proc.wait(30)
        return served(job[-1]), served(_get(f"{url}/metrics"))


def test_the_parser_finds_the_series_of_an_expression() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (endpoint, le) (rate(x_seconds_bucket{job=~"$job", a="b(c)"}[5m])))'
    )
    assert metric_names(expr) == {"x_seconds_bucket"}
    assert metric_names("rate(sglang:cached_tokens_total[1m]) / rate(sglang:prompt_tokens_total[1m])") == {
        "sglang:cached_tokens_total",
        "sglang:prompt_tokens_total",
    }
    assert metric_names('60 * rate(a_total{kind="completion"}[$__rate_interval]) and on (instance) b') == {
        "a_total",
        "b",
    }


def test_every_expression_reads_a_served_metric(scraped: tuple[set[str], set[str]]) -> None:
    job, standin = scraped
    exprs = expressions()
    assert len(exprs) >= 15
    unknown = {name: e for e in exprs for name in metric_names(e) if name not in job | standin}
    assert not unknown, f"the dashboard reads metrics nothing serves: {unknown}"
    assert all(metric_names(e) for e in exprs)


def test_every_metric_the_job_serves_has_a_panel(scraped: tuple[set[str], set[str]]) -> None:
    job, _ = scraped
    used = {name for e in expressions() for name in metric_names(e)}
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in job if n.startswith("sglfleet_generate_")}
    missing = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not missing, f"served by the job, on no panel: {sorted(missing)}"


def test_the_dashboard_is_a_grafana_import(tmp_path: Path) -> None:
    data = json.loads(DASHBOARD.read_text())
    assert data["uid"] and data["title"] and data["schemaVersion"] >= 36
    assert {v["name"] for v in data["templating"]["list"]} >= {"datasource", "job", "sglang_job"}
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
