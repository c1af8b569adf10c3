"""`sglfleet mix`: quotas, dedupe, determinism, the report against a recount, and errors that say where."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO

from sglfleet.cli import main
from sglfleet.data import DataError, build_mix, classify, custom_id, load_config, parse_config, user_text

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI caches the existing set's categories; keep that cache inside the test's directory."""
    monkeypatch.setenv("SGLFLEET_CACHE_DIR", str(tmp_path / "cache"))


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def prompts(prefix: str, n: int) -> list[str]:
    """n distinct prompts (distinct enough that near-dedupe keeps them all)."""
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november".split()  # noqa: SIM905
    return [
        f"{prefix} question {i}: tell me about {words[i % len(words)]} {words[(i * 7 + 3) % len(words)]} "
        f"in {prefix} style and the number {i * 37 + 11} in {words[(i * 3 + 5) % len(words)]} terms "
        f"for {prefix}"
        for i in range(n)
    ]


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """Three sources in three formats, 30 rows each, no duplicates among them."""
    sharegpt = [
        {"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
        for t in prompts("sg", 30)
    ]
    openai = [{"messages": [{"role": "user", "content": t}]} for t in prompts("oa", 30)]
    plain = [{"text": t} for t in prompts("pl", 30)]
    return {
        "sg": write_jsonl(tmp_path / "sg.jsonl", sharegpt),
        "oa": write_jsonl(tmp_path / "oa.jsonl", openai),
        "pl": write_jsonl(tmp_path / "pl.jsonl", plain),
    }


def base_config(src: dict[str, Path], **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "seed": 7,
        "generation": {"max_tokens": 64, "temperature": 0.5},
        "sources": [
            {"name": "sg", "path": str(src["sg"]), "format": "sharegpt", "quota": 10},
            {"name": "oa", "path": str(src["oa"]), "format": "openai", "category": "math", "quota": 12},
            {"name": "pl", "path": str(src["pl"]), "format": "prompt", "field": "text", "quota": 5},
        ],
    }
    config.update(overrides)
    return config


def run_mix(tmp_path: Path, config: dict[str, Any], name: str = "out") -> tuple[list[dict], dict]:
    cfg = parse_config(config)
    output, report = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-report.md"
    build_mix(cfg, output, report)
    return read_jsonl(output), json.loads(report.with_suffix(".json").read_text())


def test_quotas_are_met_exactly_and_lines_are_batch_requests(
    tmp_path: Path, sources: dict[str, Path]
) -> None:
    rows, report = run_mix(tmp_path, base_config(sources))
    assert Counter(r["metadata"]["source"] for r in rows) == {"sg": 10, "oa": 12, "pl": 5}
    assert report["prompts"] == 27
    for row in rows:
        assert row["method"] == "POST"
        assert row["url"] == "/v1/chat/completions"
        assert row["body"]["max_tokens"] == 64
        assert row["body"]["temperature"] == 0.5
        assert row["body"]["messages"][-1]["role"] == "user"
    assert {r["metadata"]["category"] for r in rows if r["metadata"]["source"] == "oa"} == {"math"}
    assert len({r["custom_id"] for r in rows}) == 27


def test_shares_of_total_round_to_the_total(tmp_path: Path, sources: dict[str, Path]) -> None:
    config = base_config(sources, total=10)
    for source in config["sources"]:
        source["quota"] = "33.3333%"
    assert parse_config(config).quotas() == {"sg": 4, "oa": 3, "pl": 3}
    rows, _ = run_mix(tmp_path, config)
    assert Counter(r["metadata"]["source"] for r in rows) == {"sg": 4, "oa": 3, "pl": 3}
    config["sources"][0]["quota"] = 0.5
    with pytest.raises(DataError, match="add up to"):
        parse_config(config).quotas()


def test_custom_id_is_a_stable_hash_of_source_index_and_text(
    tmp_path: Path, sources: dict[str, Path]
) -> None:
    rows, _ = run_mix(tmp_path, base_config(sources))
    texts = {i: t for i, t in enumerate(prompts("oa", 30))}
    for row in rows:
        if row["metadata"]["source"] == "oa":
            index = int(row["custom_id"].split("-")[1])
            assert row["custom_id"] == custom_id("oa", index, texts[index])
    assert custom_id("a", 1, "x") != custom_id("a", 2, "x") != custom_id("b", 1, "x")


def test_same_config_and_seed_give_byte_identical_output(tmp_path: Path, sources: dict[str, Path]) -> None:
    config = base_config(sources, dedupe={"near": {"enabled": True}})
    cfg = parse_config(config)
    build_mix(cfg, tmp_path / "a.jsonl", tmp_path / "a.md")
    build_mix(parse_config(json.loads(json.dumps(config))), tmp_path / "b.jsonl", tmp_path / "b.md")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    report_a = (tmp_path / "a.json").read_text().replace(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))
    assert report_a == (tmp_path / "b.json").read_text()
    build_mix(parse_config({**config, "seed": 8}), tmp_path / "c.jsonl")
    picked = {r["custom_id"] for r in read_jsonl(tmp_path / "a.jsonl")}
    other = {r["custom_id"] for r in read_jsonl(tmp_path / "c.jsonl")}
    assert len(other) == len(picked) and other != picked


def test_exact_duplicates_within_across_and_against_existing_are_dropped(tmp_path: Path) -> None:
    a = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"prompt": "What is the tallest mountain on Earth?"},
            {"prompt": "  what is the TALLEST mountain\non earth?  "},  # same, normalised
            {"prompt": "Name a famous painting by Vermeer."},
            {"prompt": "How do volcanoes form?"},  # in the existing set
        ],
    )
    b = write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"messages": [{"role": "user", "content": "Name a famous painting by VERMEER."}]},  # across
            {"messages": [{"role": "user", "content": "Describe the rings of Saturn."}]},
        ],
    )
    existing = write_jsonl(
        tmp_path / "existing.jsonl",
        [{"id": "e1", "conversations": [{"role": "user", "content": "How do volcanoes form?"}]}],
    )
    config = {
        "existing": {"path": str(existing)},
        "shortfall": "error",
        "sources": [
            {"name": "a", "path": str(a), "format": "prompt", "quota": 2},
            {"name": "b", "path": str(b), "format": "openai", "quota": 1},
        ],
    }
    rows, report = run_mix(tmp_path, config)
    texts = sorted(r["body"]["messages"][0]["content"] for r in rows)
    assert texts == [
        "Describe the rings of Saturn.",
        "Name a famous painting by Vermeer.",
        "What is the tallest mountain on Earth?",
    ]
    by_name = {s["name"]: s for s in report["sources"]}
    assert by_name["a"]["duplicates_by_kind"] == {"exact": 1, "existing": 1}
    assert by_name["b"]["duplicates_by_kind"] == {"exact": 1}
    config["dedupe"] = {"against_existing": False, "exact": False}
    config["sources"][0]["quota"] = 4
    config["sources"][1]["quota"] = 2
    rows, _ = run_mix(tmp_path, config, "nodedupe")
    assert len(rows) == 6


def test_near_duplicates_are_caught_when_enabled(tmp_path: Path) -> None:
    base = (
        "Explain how a refrigerator moves heat from the inside to the outside of the box, "
        "and why the coils at the back of it feel warm to the touch"
    )
    src = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"prompt": base},
            {"prompt": base + " when it runs."},  # near duplicate
            {"prompt": "Write a limerick about a cat who learns to play the violin in a small town."},
        ],
    )
    config = {"sources": [{"name": "s", "path": str(src), "format": "prompt", "quota": 2}]}
    config["dedupe"] = {"near": {"enabled": True, "threshold": 0.7}}
    rows, report = run_mix(tmp_path, config)
    assert len(rows) == 2
    assert report["sources"][0]["duplicates_by_kind"] == {"near": 1}
    config["dedupe"] = {"near": {"enabled": False}}
    config["sources"][0]["quota"] = 3
    rows, _ = run_mix(tmp_path, config, "off")
    assert len(rows) == 3


def test_filters_drop_empty_system_only_short_and_long(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "s.jsonl",
        [
            {"conversations": [{"from": "human", "value": "   "}]},
            {"conversations": [{"from": "system", "value": "You are terse."}]},
            {"conversations": [{"from": "human", "value": "hi"}]},
            {"conversations": [{"from": "human", "value": "x" * 500}]},
            {"conversations": [{"from": "human", "value": "How are rainbows made?"}]},
        ],
    )
    config = {
        "filters": {"min_chars": 5, "max_chars": 100},
        "sources": [{"name": "s", "path": str(src), "format": "sharegpt", "quota": 1}],
    }
    rows, report = run_mix(tmp_path, config)
    assert [r["body"]["messages"][0]["content"] for r in rows] == ["How are rainbows made?"]
    assert report["sources"][0]["filtered_by_reason"] == {
        "empty": 1,
        "system_only": 1,
        "too_long": 1,
        "too_short": 1,
    }


def test_report_numbers_equal_a_recount_of_the_output(tmp_path: Path) -> None:
    config = load_config(REPO / "examples/mix/lab-mix.yaml")
    output, report_md = tmp_path / "prompts.jsonl", tmp_path / "mix-report.md"
    build_mix(config, output, report_md)
    rows = read_jsonl(output)
    report = json.loads(report_md.with_suffix(".json").read_text())
    assert report["prompts"] == len(rows) == 120
    chosen = Counter((r["metadata"]["source"], r["metadata"]["category"]) for r in rows)
    for source in report["sources"]:
        assert source["chosen"] == sum(n for (s, _), n in chosen.items() if s == source["name"])
        assert source["chosen"] == source["quota"] == source["target"]
        for category, tally in source["categories"].items():
            assert tally["chosen"] == chosen[(source["name"], category)]
        # every row read is accounted for exactly once
        accounted = source["invalid"] + source["filtered"] + source["duplicates"] + source["available"]
        assert source["read"] == accounted
        lines = Path(source["path"]).read_text(encoding="utf-8")
        expected = len(json.loads(lines)) if source["path"].endswith(".json") else len(lines.splitlines())
        assert source["read"] == expected
    new = Counter(r["metadata"]["category"] for r in rows)
    assert {c: v["rows"] for c, v in report["shares"]["new"].items()} == dict(new)
    for row in rows:  # categories are what the classifier says (or the source's fixed one)
        if row["metadata"]["source"] != "multilingual":
            assert row["metadata"]["category"] == classify(user_text(row["body"]["messages"]))
    existing = report["shares"]["existing"]
    assert existing["code"] == {"rows": 77, "share": 0.77}
    merged = report["shares"]["merged"]
    assert sum(v["rows"] for v in merged.values()) == 100 + 120
    assert merged["code"]["share"] < 0.4  # the skew is cut
    markdown = report_md.read_text()
    assert "| code | 77 (77.0%) | 0 (0.0%) | 77 (35.0%) |" in markdown


def test_shortfall_error_names_the_source(tmp_path: Path, sources: dict[str, Path]) -> None:
    config = base_config(sources)
    config["sources"][1]["quota"] = 31
    with pytest.raises(DataError, match=r"source 'oa': quota 31 but only 30 prompts are left"):
        run_mix(tmp_path, config)
    assert not (tmp_path / "out.jsonl").exists()


def test_shortfall_fill_takes_from_the_others_in_proportion(tmp_path: Path, sources: dict[str, Path]) -> None:
    config = base_config(sources, shortfall="fill")
    config["sources"][0]["quota"] = 40  # sg has 30: 10 short
    config["sources"][1]["quota"] = 12
    config["sources"][2]["quota"] = 8
    rows, report = run_mix(tmp_path, config)
    counts = Counter(r["metadata"]["source"] for r in rows)
    assert sum(counts.values()) == 60
    # the 10 missing split 12:8 over oa and pl → 6 and 4
    assert counts == {"sg": 30, "oa": 18, "pl": 12}
    assert any("'sg' had 30 of its quota 40" in n and "'oa' (+6)" in n for n in report["notes"])
    config["sources"][1]["quota"] = 29
    config["sources"][2]["quota"] = 28  # 1 + 2 spare rows left for 10 missing
    with pytest.raises(DataError, match=r"cannot fill 10 missing prompts: .* only 3 prompts"):
        run_mix(tmp_path, config, "toomuch")


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda c: c["sources"][1].update(format="xml"), r"sources\[1\] \('oa'\)\.format: Input should be"),
        (
            lambda c: c["sources"][0].update(path="/nonexistent/x.jsonl"),
            r"source 'sg': /nonexistent/x.jsonl: no such",
        ),
        (
            lambda c: c["sources"][2].update(field="question"),
            r"source 'pl': .*pl\.jsonl:1: row has no field 'question'",
        ),
        (lambda c: c["sources"][0].update(quota="150%"), r"sources\[0\] \('sg'\)\.quota"),
        (lambda c: c["sources"][0].update(path="data.csv"), r"source 'sg': .*cannot tell the file type"),
        (lambda c: c.update(colour="blue"), r"colour: Extra inputs are not permitted"),
        (
            lambda c: c["sources"][2].update(quota={}),
            r"sources\[2\] \('pl'\)\.quota: Value error, give either",
        ),
        (lambda c: c["sources"].append(dict(c["sources"][0])), r"two sources are named 'sg'"),
    ],
)
def test_bad_configs_name_the_source_and_the_field(
    tmp_path: Path, sources: dict[str, Path], mutate, pattern
) -> None:
    config = base_config(sources)
    (tmp_path / "data.csv").write_text("a,b\n")
    mutate(config)
    config_path = write_config(tmp_path / "mix.yaml", config)
    with pytest.raises(DataError, match=pattern):
        build_mix(load_config(config_path), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_bad_row_names_the_source_and_line_or_is_skipped(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "s.jsonl",
        [{"messages": [{"role": "user", "content": "Fine question here"}]}, {"messages": "not a list"}],
    )
    config = {"sources": [{"name": "s", "path": str(src), "format": "openai", "quota": 1}]}
    with pytest.raises(DataError, match=r"source 's': .*s\.jsonl:2: field 'messages' is a str"):
        run_mix(tmp_path, config)
    config["sources"][0]["skip_bad_rows"] = True
    rows, report = run_mix(tmp_path, config)
    assert len(rows) == 1 and report["sources"][0]["invalid"] == 1
    (tmp_path / "broken.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    config = {
        "sources": [{"name": "b", "path": str(tmp_path / "broken.jsonl"), "format": "prompt", "quota": 1}]
    }
    with pytest.raises(DataError, match=r"source 'b': .*broken\.jsonl:2: not valid JSON"):
        run_mix(tmp_path, config)


def test_cli_mix_writes_the_prompts_and_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "p.jsonl"
    args = ["mix", "--config", str(REPO / "examples/mix/lab-mix.yaml"), "--output", str(out)]
    assert main([*args, "--report", str(tmp_path / "r.md")]) == 0
    assert len(out.read_text().splitlines()) == 120
    assert (tmp_path / "r.json").exists()
    assert main(["mix", "--config", str(tmp_path / "none.yaml"), "--output", str(out)]) == 2
    assert "none.yaml: cannot read the mix config" in capsys.readouterr().err
