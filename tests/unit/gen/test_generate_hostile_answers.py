"""A bad answer is that request's error, never a worker's death (issue 28, point 2).

A server answers 200 with bodies that are not completions that can be stored (`latency_server.HOSTILE`:
usage counts that are strings, lists, bools, negative or over 64 bits; choices, message, content, role,
reasoning_content, finish_reason or id of the wrong type; not JSON, torn, empty). Each is
`invalid_response`: retried, then written to the errors file; the run ends with every request
accounted for, and every worker alive to the end.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from support.generate import assert_exactly_once, latency_servers, read_jsonl, run_job, write_batch
from support.latency_server import HOSTILE

from sglfleet.gen import ExitCode, OutputStore, completion_problem

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
def test_every_hostile_shape_is_found_before_it_is_stored(raw: bytes) -> None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return  # not JSON: the client's own check (a 200 whose body is not a JSON object)
    assert not isinstance(body, dict) or completion_problem(body) is not None


def _no_task_died(caplog: pytest.LogCaptureFixture) -> None:
    dead = [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert dead == [], dead


def test_100_bad_answers_are_100_errors_and_no_worker_dies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 100)
    with caplog.at_level(logging.ERROR), latency_servers(1, 0.0, "hostile") as urls:
        outcome = run_job(inp, out, urls, max_retries=1, concurrency=4)
    assert outcome.exit_code == ExitCode.FAILURES, outcome.message  # docs/exit-codes.md: 3, rerun retries
    assert outcome.next == "rerun"
    assert out.read_bytes() == b"", "a bad answer is never written as a result"
    errors = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == ids  # every request accounted for, once
    assert {e["error"]["code"] for e in errors} == {"invalid_response"}
    assert any("usage.prompt_tokens is 'abc', not a token count" in e["error"]["message"] for e in errors)
    m = outcome.manifest
    assert m is not None and m.counts.failed == 100 and m.counts.retries_this_run == 100
    _no_task_died(caplog)


def test_bad_first_answers_are_retried_and_every_request_gets_a_good_result(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 100)
    with caplog.at_level(logging.ERROR), latency_servers(2, 0.0, "hostile_once") as urls:
        outcome = run_job(inp, out, urls, concurrency=4)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    for line in assert_exactly_once(out, ids):
        assert completion_problem(line["response"]["body"]) is None
    _no_task_died(caplog)


def test_an_exception_while_handling_one_request_is_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a worker meets while handling one request (here: storing its result raises) is that
    request's `internal_error`; the worker goes on with the next request."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 40)
    unlucky = set(ids[::10])
    add_result = OutputStore.add_result

    def fragile(self: OutputStore, custom_id: str, *args: object, **kw: object) -> None:
        if custom_id in unlucky:
            raise RuntimeError(f"cannot store {custom_id}")
        add_result(self, custom_id, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(OutputStore, "add_result", fragile)
    with caplog.at_level(logging.ERROR), latency_servers(1, 0.0, "ok") as urls:
        outcome = run_job(inp, out, urls, concurrency=2)
    assert outcome.exit_code == ExitCode.FAILURES, outcome.message
    assert sorted(r["custom_id"] for r in read_jsonl(out)) == sorted(set(ids) - unlucky)
    errors = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert sorted(e["custom_id"] for e in errors) == sorted(unlucky)
    assert {e["error"]["code"] for e in errors} == {"internal_error"}
    assert "RuntimeError: cannot store" in errors[0]["error"]["message"]
    _no_task_died(caplog)
