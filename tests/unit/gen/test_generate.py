"""The generation engine against real stand-in servers on 127.0.0.1 (no HTTP mocks)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from sglfleet_testing.standin.process import StandinProcess
from support.generate import (
    assert_exactly_once,
    fleet,
    read_jsonl,
    requests_served,
    write_batch,
    write_conversations,
)

from sglfleet.cli import main as cli_main
from sglfleet.gen import (
    ExitCode,
    GenerateConfig,
    GenParams,
    LogReporter,
    Outcome,
    RichReporter,
    manifest_path,
    run,
)
from sglfleet.gen import load_manifest as load

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def three() -> Iterator[list[str]]:
    with fleet({}, {}, {}) as servers:
        yield [s.base_url for s in servers]


def _run(inp: Path, out: Path, endpoints: list[str], **kw: object) -> Outcome:
    kw.setdefault("concurrency", 8)
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("probe_interval", 0.1)
    config = GenerateConfig(input=inp, output=out, endpoints=endpoints, **kw)  # type: ignore[arg-type]
    return run(config, LogReporter(io.StringIO(), interval=0.5), handle_signals=False)


def test_a_job_writes_one_result_per_id_and_a_manifest(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 300)
    outcome = _run(inp, out, three, params=GenParams(model="m", max_tokens=24, temperature=0.0))
    assert outcome.exit_code == ExitCode.OK, outcome.message
    records = assert_exactly_once(out, ids)
    assert all(r["response"]["body"]["usage"]["completion_tokens"] <= 24 for r in records)
    m = load(manifest_path(out))
    assert m is not None and m.status == "complete"
    assert (m.counts.total, m.counts.done, m.counts.failed, m.counts.remaining) == (300, 300, 0, 0)
    assert m.input.format == "conversation" and len(m.input.sha256) == 64
    assert m.params == {"model": "m", "max_tokens": 24, "temperature": 0.0, "top_p": None}
    assert m.tokens.completion == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in records)
    assert m.throughput.requests_per_s > 0 and m.throughput.output_tokens_per_s > 0
    assert sum(s["ok"] for s in m.endpoint_stats.values()) == 300
    assert all(s["ok"] > 0 for s in m.endpoint_stats.values()), "every endpoint took a share"
    assert (tmp_path / "out.jsonl.errors.jsonl").read_text() == ""

    # a rerun of a complete job sends nothing and changes no result
    before = out.read_bytes()
    again = _run(inp, out, three, params=GenParams(model="m", max_tokens=24, temperature=0.0))
    assert again.exit_code == ExitCode.OK and again.manifest is not None
    assert again.manifest.counts.sent_this_run == 0 and again.manifest.timings.runs == 2
    assert again.manifest.tokens.completion == m.tokens.completion, "tokens are read back from the output"
    assert out.read_bytes() == before


def test_resume_sends_only_the_missing_ids(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 200)
    assert _run(inp, out, three).exit_code == ExitCode.OK
    lines = out.read_bytes().splitlines(keepends=True)
    kept = lines[::3]
    out.write_bytes(b"".join(kept) + lines[1][:40])  # lose 2/3 of the results, tear the last line
    outcome = _run(inp, out, three)
    assert outcome.exit_code == ExitCode.OK and outcome.manifest is not None
    assert outcome.manifest.counts.sent_this_run == 200 - len(kept)
    assert_exactly_once(out, ids)


def test_changed_input_or_params_is_refused_unless_forced(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 20)
    assert _run(inp, out, three, params=GenParams(max_tokens=8)).exit_code == ExitCode.OK
    refused = _run(inp, out, three, params=GenParams(max_tokens=9))
    assert refused.exit_code == ExitCode.BAD_INPUT and "max_tokens: 8 → 9" in refused.message
    more = write_batch(inp, 30)
    refused = _run(inp, out, three, params=GenParams(max_tokens=8))
    assert refused.exit_code == ExitCode.INPUT_CHANGED
    assert "the input grew from" in refused.message and "lines were appended" in refused.message
    forced = _run(inp, out, three, params=GenParams(max_tokens=8), force=True)
    assert forced.exit_code == ExitCode.OK and forced.manifest is not None
    assert forced.manifest.counts.sent_this_run == 10
    assert_exactly_once(out, more)
    assert set(ids) < set(more)


def test_injected_500s_and_hangs_are_retried_never_lost(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 200)
    flags = [
        {"standin_error_rate": 0.3, "standin_seed": 1},
        {"standin_hang_rate": 0.05, "standin_seed": 2},
        {"standin_error_rate": 0.1, "standin_hang_rate": 0.02, "standin_seed": 3},
    ]
    with fleet(*flags) as servers:
        outcome = _run(
            inp, out, [s.base_url for s in servers], request_timeout=0.5, max_retries=8, down_after=1000
        )
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert outcome.manifest is not None and outcome.manifest.counts.retries_this_run > 0
    assert_exactly_once(out, ids)


def test_retries_exhausted_are_reported_then_retried_by_the_next_run(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 30)
    with fleet({"standin_error_rate": 1.0}) as servers:
        outcome = _run(inp, out, [servers[0].base_url], max_retries=2, down_after=1000)
        assert requests_served(servers[0].base_url) == 0  # 500s are not counted as served
    assert outcome.exit_code == ExitCode.FAILURES, outcome.message
    errors = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == ids
    assert all(e["error"]["code"] == "retries_exhausted" for e in errors)
    assert all(
        e["error"]["message"].startswith("HTTP 500") and "3 attempts" in e["error"]["message"] for e in errors
    )
    assert out.read_bytes() == b""
    with fleet({}) as servers:
        outcome = _run(inp, out, [servers[0].base_url])
    assert outcome.exit_code == ExitCode.OK
    assert_exactly_once(out, ids)
    assert (tmp_path / "out.jsonl.errors.jsonl").read_text() == ""


def test_4xx_is_a_permanent_failure_with_the_servers_message(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 10)
    with inp.open("a") as fh:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}
        fh.write(
            json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions", "body": body})
        )
    outcome = _run(inp, out, three)
    assert outcome.exit_code == ExitCode.FAILURES
    (error,) = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["error"]["message"].startswith("HTTP 400: ") and "max_tokens" in error["error"]["message"]
    assert_exactly_once(out, ids)
    assert outcome.manifest is not None and outcome.manifest.status == "complete_with_failures"


def test_an_instance_killed_mid_run_the_job_completes_on_the_rest(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 400)
    with fleet({"standin_crash_after": 25}, {"standin_ttft": 0.005}, {"standin_ttft": 0.005}) as servers:
        outcome = _run(inp, out, [s.base_url for s in servers], down_after=2, request_timeout=5)
        crashed: StandinProcess = servers[0]
        assert crashed.process.poll() is not None, "the stand-in crashed as injected"
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert_exactly_once(out, ids)
    assert outcome.manifest is not None
    stats = outcome.manifest.endpoint_stats[crashed.base_url]
    assert stats["up"] == 0.0 and 0 < stats["ok"] <= 25


def test_preflight_no_endpoint_answering_fails_within_seconds_and_sends_nothing(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 5)
    with fleet({}) as servers:
        url = servers[0].base_url
    t0 = time.monotonic()
    outcome = _run(inp, out, [url], down_timeout=600)
    assert time.monotonic() - t0 < 5
    assert outcome.exit_code == ExitCode.NO_ENDPOINT and "no endpoint answers" in outcome.message
    assert f"{url}: refused" in outcome.message
    assert not out.exists() and not manifest_path(out).exists()


def test_preflight_starts_on_the_endpoints_that_answer(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 40)
    with fleet({}) as servers:
        dead = servers[0].base_url
    outcome = _run(inp, out, [dead, *three])
    assert outcome.exit_code == ExitCode.OK and outcome.manifest is not None
    assert outcome.manifest.endpoint_stats[dead]["sent"] == 0
    assert_exactly_once(out, ids)


def test_every_endpoint_gone_mid_run_stops_resumably(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 50)
    with fleet({"standin_crash_after": 10}) as servers:
        outcome = _run(inp, out, [servers[0].base_url], concurrency=1, down_after=1, down_timeout=0.5)
    assert outcome.exit_code == ExitCode.NO_ENDPOINT and "no endpoint has answered" in outcome.message
    assert outcome.manifest is not None and outcome.manifest.counts.remaining == 40


def test_a_wrong_api_key_stops_at_once_with_its_own_exit_code(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 5)
    with fleet({"api_key": "sekrit"}, {"api_key": "sekrit"}) as servers:
        urls = [s.base_url for s in servers]
        for key in (None, "wrong"):
            t0 = time.monotonic()
            denied = _run(inp, out, urls, api_key=key)
            assert time.monotonic() - t0 < 5
            assert denied.exit_code == ExitCode.AUTH, denied.message
            assert "401 Unauthorized from http://127.0.0.1:" in denied.message
            assert "check the API key" in denied.message
            assert sum(requests_served(u) for u in urls) == 0
        assert _run(inp, out, urls, api_key="sekrit").exit_code == ExitCode.OK
    assert_exactly_once(out, ids)


def test_bad_input_reports_each_line_and_sends_nothing(
    tmp_path: Path, three: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 4)
    good = inp.read_text().splitlines()
    bad = [
        good[0],
        "{broken",
        good[1],
        json.dumps({"custom_id": "z", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}),
        good[0],
        json.dumps(
            {"custom_id": "e", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}
        ),
    ]
    inp.write_text("\n".join(bad) + "\n")
    before = sum(requests_served(u) for u in three)
    code = cli_main(["generate", "-i", str(inp), "-o", str(out), *(x for u in three for x in ("-e", u))])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{inp}:2: bad JSON" in err
    assert f"{inp}:4: unsupported url '/v1/embeddings'" in err
    assert f"{inp}:5: duplicate id 'b000000' (first on line 1)" in err
    assert f"{inp}:6: body.messages is empty" in err
    assert "4 bad lines; nothing was sent" in err
    assert sum(requests_served(u) for u in three) == before
    assert not out.exists() and not manifest_path(out).exists()


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 1)
    assert cli_main(["generate", "-i", str(inp), "-o", str(tmp_path / "o"), "-e", "localhost:1"]) == 2
    assert "'localhost:1' is not an http(s)://HOST:PORT URL" in capsys.readouterr().err
    code = cli_main(["generate", "-i", str(inp), "-o", str(tmp_path / "o"), "-e", "http://h:30000/v1"])
    assert code == 2 and "must be a base URL without path" in capsys.readouterr().err
    assert (
        cli_main(["generate", "-i", str(tmp_path / "nope"), "-o", str(tmp_path / "o"), "-e", "http://x"]) == 2
    )
    assert "is not a file" in capsys.readouterr().err


def test_progress_live_bar_on_a_terminal_and_log_lines_off_it(tmp_path: Path, three: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_batch(inp, 50)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    config = GenerateConfig(input=inp, output=out, endpoints=three, concurrency=2)
    assert run(config, RichReporter(console, interval=0.01), handle_signals=False).exit_code == ExitCode.OK
    text = screen.getvalue()
    assert "50/50" in text and "req/s" in text and "out tok/s" in text and "ETA" in text
    for url in three:
        assert url.removeprefix("http://") in text, "one row per endpoint"

    log = io.StringIO()
    out.unlink()
    manifest_path(out).unlink()
    assert run(config, LogReporter(log, interval=0.01), handle_signals=False).exit_code == ExitCode.OK
    last = log.getvalue().splitlines()[-1]
    assert last.startswith("generate: 50/50 (100.0%)") and "errors 0" in last and "in flight" in last


def test_cli_endpoints_file_and_exit_0(
    tmp_path: Path, three: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 30)
    eps = tmp_path / "endpoints.txt"
    eps.write_text(f"# the fleet\n{three[0]}\n\n{three[1]}  # gpu 1\n")
    code = cli_main(
        ["generate", "-i", str(inp), "-o", str(out), "--endpoints-file", str(eps), "-e", three[2]]
    )
    assert code == 0, capsys.readouterr()
    assert "30/30 done, 0 failed" in capsys.readouterr().out
    m = load(manifest_path(out))
    assert m is not None and m.endpoints == [three[2], three[0], three[1]]  # --endpoint, then the file
    assert_exactly_once(out, ids)


def test_a_slow_endpoint_gets_fewer_requests_not_an_equal_share(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 200)
    with fleet({"standin_ttft": 0.2}, {"standin_ttft": 0.005}) as (slow, fast):
        outcome = _run(inp, out, [slow.base_url, fast.base_url], concurrency=2)
    assert outcome.exit_code == ExitCode.OK and outcome.manifest is not None
    shares = {url: s["ok"] for url, s in outcome.manifest.endpoint_stats.items()}
    assert shares[slow.base_url] < 0.2 * 200 < shares[fast.base_url], shares  # round robin: 100 each
    assert_exactly_once(out, ids)
