"""One record, one truth (issue 28): the job's lines are read by one definition (`sglfleet.records`), so
resume, merge and `job status` agree on what a result is, and the results on disk win over the manifest.
Real stand-in servers on 127.0.0.1, real files."""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.generate import latency_servers, read_jsonl, run_job, write_batch
from support.latency_server import HOSTILE

from sglfleet.cli import main
from sglfleet.data import DataError, merge
from sglfleet.gen import ExitCode, OutputStore, StoreError, job_status, result_line
from sglfleet.records import RESULTS_MISSING, answer_problem, done_of, full_done_of

pytestmark = pytest.mark.timeout(120)


def _answer(tokens: Any = 30, **usage: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "an answer " * 10}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens, **usage},
    }


def _success(cid: Any, body: Any = None, **top: Any) -> bytes:
    record = {
        "id": "batch_req_h",
        "custom_id": cid,
        "response": {"status_code": 200, "body": body or _answer()},
    }
    return orjson.dumps({**record, "error": None, **top}) + b"\n"


def _input_line(cid: str) -> bytes:
    body = {"messages": [{"role": "user", "content": f"question {cid}"}], "max_tokens": 16}
    return (
        orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
        + b"\n"
    )


def _with(mutate: Any) -> bytes:
    record = orjson.loads(_success("x"))
    mutate(record)
    return orjson.dumps(record) + b"\n"


# (name, line for custom_id "x", is it a result resume counts done)
ADVERSARIAL: list[tuple[str, bytes, bool]] = [
    ("ours", result_line("x", "r", _answer(), None, "batch_req_1"), True),
    ("ours, conversations kept", result_line("x", "r", _answer(), None, "b", conversations=[]), True),
    (
        "pasted by hand, no id, no error key",
        orjson.dumps({"custom_id": "x", "response": {"status_code": 200, "body": _answer()}}) + b"\n",
        True,
    ),
    ("usage absent", _with(lambda r: r["response"]["body"].pop("usage")), True),
    (
        "error record, response null",
        orjson.dumps(
            {
                "id": "e",
                "custom_id": "x",
                "response": None,
                "error": {"code": "http_error", "message": "HTTP 500"},
            }
        )
        + b"\n",
        False,
    ),
    (
        "error record with status 500",
        orjson.dumps(
            {
                "id": "e",
                "custom_id": "x",
                "response": {"status_code": 500, "body": {"message": "boom"}},
                "error": {"code": "x", "message": "y"},
            }
        )
        + b"\n",
        False,
    ),
    ("status 200 but error set", _with(lambda r: r.update(error={"code": "x", "message": "y"})), False),
    ("status 500, error null", _with(lambda r: r["response"].update(status_code=500)), False),
    ("status '200' as a string", _with(lambda r: r["response"].update(status_code="200")), False),
    ("status true", _with(lambda r: r["response"].update(status_code=True)), False),
    ("no response", _with(lambda r: r.pop("response")), False),
    ("raw input line", _input_line("x"), False),
    ("no choices", _with(lambda r: r["response"]["body"].update(choices=[])), False),
    (
        "usage.prompt_tokens 'abc'",
        _with(lambda r: r["response"]["body"]["usage"].update(prompt_tokens="abc")),
        False,
    ),
    (
        "usage.prompt_tokens [1]",
        _with(lambda r: r["response"]["body"]["usage"].update(prompt_tokens=[1])),
        False,
    ),
    (
        "usage.completion_tokens 1.5",
        _with(lambda r: r["response"]["body"]["usage"].update(completion_tokens=1.5)),
        False,
    ),
    (
        "usage.completion_tokens -3",
        _with(lambda r: r["response"]["body"]["usage"].update(completion_tokens=-3)),
        False,
    ),
    (
        "usage.completion_tokens true",
        _with(lambda r: r["response"]["body"]["usage"].update(completion_tokens=True)),
        False,
    ),
    ("usage a list", _with(lambda r: r["response"]["body"].update(usage=[1, 2])), False),
    ("body a string", _with(lambda r: r["response"].update(body="oops")), False),
    (
        "choices[0].message a string",
        _with(lambda r: r["response"]["body"]["choices"][0].update(message="m")),
        False,
    ),
    ("custom_id an integer", _success(7), False),
    ("custom_id null", _success(None), False),
    ("custom_id empty", _success(""), False),
    ("a JSON list", b"[1, 2]\n", False),
]


# more shapes at the fast path's edges (each checked against the full parse)
EDGES: list[bytes] = [
    _with(lambda r: r["response"].update(status_code=200.0)),
    _with(lambda r: r["response"]["body"]["usage"].pop("prompt_tokens")),
    _with(lambda r: r["response"]["body"]["usage"].update(completion_tokens=None)),
    _success("x").replace(b'"prompt_tokens":5', b'"prompt_tokens":123456789012345678901234567890'),
    _with(lambda r: r["response"]["body"]["choices"][0].pop("message")),
    _with(lambda r: r["response"]["body"]["choices"][0].update(message=None)),
    _with(lambda r: r["response"]["body"]["choices"].__setitem__(0, [])),
    _with(lambda r: r["response"]["body"].update(usage=None)),
    _with(lambda r: r.update(error=False)),
    _with(lambda r: r.update(error=0)),
    _with(lambda r: r.update(custom_id=["x"])),
    _with(lambda r: r.update(response=[])),
    _with(lambda r: r["response"].update(body=None)),
    b'{"custom_id": "x", "custom_id": 7, "response": {"status_code": 200}}\n',
    b"  " + _success("x").rstrip() + b"  \n",
    b"\xef\xbb\xbf" + _success("x"),
]


@pytest.mark.parametrize("line", [a[1] for a in ADVERSARIAL] + EDGES)
def test_resumes_fast_path_agrees_with_the_full_parse(line: bytes) -> None:
    """`done_of` checks the shape generate writes inline; on every line it says what the full parse
    (`result_of`) says, and on every cut of the line too (both refuse what is not JSON)."""
    for raw in [line] + [line[:cut] for cut in range(1, len(line))]:
        try:
            full = full_done_of(raw)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                done_of(raw)
            continue
        assert done_of(raw) == full, raw


def test_answer_problem_says_what_resume_would_not_count() -> None:
    """The request path's check of an answer (before it is stored) is the store's definition."""
    assert answer_problem(_answer()) is None
    bad = _answer()
    bad["usage"]["prompt_tokens"] = "abc"
    assert answer_problem(bad) == (
        "response.body.usage.prompt_tokens is 'abc', not a token count (an integer, 0 or more)"
    )
    assert answer_problem({"choices": []}) == "response.body has no choices"
    assert answer_problem(None) == "response.body is null"
    assert answer_problem([1]) == "response.body is a list, expected an object"


def _bodies() -> list[Any]:
    """Answer bodies at the edges of what the request path stores: every hostile answer of
    `latency_server.HOSTILE`, each field of a good answer removed, nulled or given a wrong type."""
    bodies: list[Any] = []
    for raw in HOSTILE:
        try:
            bodies.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue
    good = _answer()
    good["choices"][0]["finish_reason"] = "stop"
    good["usage"]["total_tokens"] = 35
    good["choices"][0]["message"]["reasoning_content"] = "because"
    bodies.append(good)
    odd: list[Any] = [None, "x", 7, -1, 1.5, True, [], {}, ["x"], 2**63]
    for path in (
        ("id",),
        ("usage",),
        ("usage", "prompt_tokens"),
        ("usage", "completion_tokens"),
        ("usage", "total_tokens"),
        ("choices",),
        ("choices", 0),
        ("choices", 0, "message"),
        ("choices", 0, "message", "content"),
        ("choices", 0, "message", "role"),
        ("choices", 0, "finish_reason"),
    ):
        for value in [..., *odd]:
            body = copy.deepcopy(good)
            node = body
            for key in path[:-1]:
                node = node[key]
            if value is ...:
                del node[path[-1]]
            else:
                node[path[-1]] = value
            bodies.append(body)
    bodies.append({"choices": [{"index": 0, "text": "a text completion"}]})
    bodies.append({"object": "error", "message": "boom"})
    return bodies


@pytest.mark.parametrize("body", _bodies())
def test_what_the_request_path_stores_resume_counts_and_merge_reads(body: Any) -> None:
    """One definition of an answer (`records.answer_problem`, what the request path checks every 200
    with): a body it accepts, written by `result_line`, is a result for `result_of` (so resume counts
    it done, merge reads it, no field refused); a body it refuses is never stored, and is never a
    result with a count of the wrong type either."""
    problem = answer_problem(body)
    line = result_line("x", "r", body, orjson.dumps(body), "batch_req_1")
    if problem is None:
        assert done_of(line) == full_done_of(line)
        assert done_of(line) is not None and done_of(line)[0] == "x"  # type: ignore[index]
    else:
        assert isinstance(problem, str) and problem
        assert done_of(line) == full_done_of(line)


def _prompts(path: Path, ids: list[str]) -> None:
    path.write_bytes(b"".join(_input_line(cid) for cid in ids))


def _existing(path: Path) -> Path:
    row = {"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize(("name", "line", "done"), ADVERSARIAL, ids=[a[0] for a in ADVERSARIAL])
def test_resume_and_merge_agree_on_every_line(tmp_path: Path, name: str, line: bytes, done: bool) -> None:
    """Between two good results, the line is done for resume exactly when merge takes it as a result: an
    id resume would send again is never a row of the training set, and a row merge keeps is never sent
    again (merge may still drop a result by its own policy: too short, cut by length, no usage)."""
    out = tmp_path / "out.jsonl"
    out.write_bytes(_success("a") + line + _success("b"))
    assert (done_of(line) is not None) is done  # the one definition
    store = OutputStore(out)
    resumed = store.open()
    store.close()
    assert ("x" in resumed.done) is done, name
    assert resumed.lines == 2 + done
    prompts = tmp_path / "prompts.jsonl"
    _prompts(prompts, ["a", "x", "b"])
    merged = tmp_path / "merged.jsonl"
    try:
        report = merge(_existing(tmp_path / "e.jsonl"), out, prompts, merged, min_completion_tokens=1)
    except DataError as exc:  # a result of the wrong shape is refused, naming the field: never kept
        assert not done, f"{name}: merge refused a line resume counts done: {exc}"
        assert "results:" not in str(exc)
        return
    rows = [json.loads(raw)["id"] for raw in merged.read_text().splitlines()[1:]]
    assert rows[0] == "a" and rows[-1] == "b"
    if done:  # kept, or dropped by merge's own policy (here: no usage to check the length with)
        assert "x" in rows or set(report.dropped) == {"no_usage"}, (name, rows, dict(report.dropped))
    else:
        assert "x" not in rows and report.dropped == {"failed": 1}, (name, rows, dict(report.dropped))


def test_a_line_cut_anywhere_in_the_middle_is_refused_by_both(tmp_path: Path) -> None:
    """Truncated JSON in the middle of the file (not a torn last line): resume and merge both refuse it,
    neither counts it; at the end of the file resume cuts it and sends that id again."""
    whole = result_line("x", "r", _answer(), None, "batch_req_1")
    prompts = tmp_path / "prompts.jsonl"
    _prompts(prompts, ["a", "x", "b"])
    for cut in range(1, len(whole) - 1, 7):
        out = tmp_path / f"out{cut}.jsonl"
        out.write_bytes(_success("a") + whole[:cut] + b"\n" + _success("b"))
        with pytest.raises(StoreError, match="line 2 is not an output record"):
            OutputStore(out).open()
        with pytest.raises(DataError, match=":2: not valid JSON"):
            merge(_existing(tmp_path / "e.jsonl"), out, prompts, tmp_path / "m.jsonl")
        out.write_bytes(_success("a") + whole[:cut] + b"\n")
        store = OutputStore(out)
        resumed = store.open()
        store.close()
        assert "x" not in resumed.done and out.read_bytes() == _success("a"), cut


# -- 3. resume counts only the successes of this input ------------------------------------------------


def test_force_into_an_output_without_manifest_sends_every_id_without_a_success(tmp_path: Path) -> None:
    """What `next:` suggests for an output without a manifest (--force): an error record, an input line
    or a line pasted by hand does not count as done; only a well-formed success does."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 6)
    lines = [
        orjson.dumps(
            {"id": "e", "custom_id": ids[0], "response": None, "error": {"code": "c", "message": "m"}}
        ),
        orjson.dumps(
            {"custom_id": ids[1], "response": {"status_code": 500, "body": None}, "error": {"m": 1}}
        ),
        _input_line(ids[2]).rstrip(),
        _with(
            lambda r: r.update(custom_id=ids[3]) or r["response"]["body"]["usage"].update(prompt_tokens="abc")
        ),
        _success(ids[4]).rstrip(),  # a real success: not sent again
        _success("not-in-this-input").rstrip(),
    ]
    out.write_bytes(b"\n".join(line.rstrip(b"\n") for line in lines) + b"\n")
    with latency_servers(1, 0.0, "ok") as urls:
        refused = run_job(inp, out, urls)
        assert refused.exit_code == ExitCode.BAD_INPUT and "--force" in refused.message
        outcome = run_job(inp, out, urls, force=True)
        with urllib.request.urlopen(f"{urls[0]}/bodies", timeout=5) as resp:
            sent = sorted(json.loads(resp.read()), key=lambda b: b["messages"][-1]["content"])
    assert outcome.exit_code == ExitCode.OK, outcome.message
    prompts = [b["messages"][-1]["content"] for b in sent]
    assert prompts == [f"prompt {i}" for i in (0, 1, 2, 3, 5)], "id 4 (already a success) is not sent again"
    successes = {r["custom_id"] for r in read_jsonl(out) if done_of(orjson.dumps(r)) is not None}
    assert set(ids) <= successes
    assert outcome.manifest is not None and outcome.manifest.counts.done == 6


# -- 4. the results on disk are the truth -------------------------------------------------------------


@pytest.fixture
def complete_job(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_batch(inp, 8)
    with latency_servers(1, 0.0, "ok") as urls:
        outcome = run_job(inp, out, urls)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert outcome.manifest is not None and outcome.manifest.results is not None
    assert outcome.manifest.results.size == out.stat().st_size and outcome.manifest.results.results == 8
    return inp, out, ids


DAMAGE = {
    "deleted": lambda out: out.unlink(),
    "emptied": lambda out: out.write_bytes(b""),
    "cut at a line end": lambda out: out.write_bytes(b"".join(out.read_bytes().splitlines(True)[:5])),
    "torn tail": lambda out: out.write_bytes(out.read_bytes()[:-40]),
    "replaced": lambda out: out.write_bytes(out.read_bytes().replace(b"batch_req_", b"batch_req_X")),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_job_status_and_merge_check_the_manifest_against_the_results(
    complete_job: tuple[Path, Path, list[str]], damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out, ids = complete_job
    assert job_status(out).state == "complete"
    DAMAGE[damage](out)
    st = job_status(out)
    assert st.state == "results_missing" and st.message.startswith(RESULTS_MISSING), st
    assert main(["job", "status", str(out)]) == 11
    assert f"results missing ({RESULTS_MISSING}" in capsys.readouterr().out  # the state in words (cli/job.py)
    existing = _existing(out.with_name("e.jsonl"))
    if out.exists():
        with pytest.raises(DataError, match=RESULTS_MISSING):
            merge(existing, out, None, out.with_name("merged.jsonl"), min_completion_tokens=1)
        assert not out.with_name("merged.jsonl").exists()
    with latency_servers(1, 0.0, "ok") as urls:  # the rerun resumes: the results are whole again
        outcome = run_job(inp, out, urls)
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert job_status(out).state == "complete"
    report = merge(existing, out, None, out.with_name("merged.jsonl"), min_completion_tokens=1)
    assert sum(report.new.values()) == len(ids)


# -- 5. whatever generate accepts, merge carries through ----------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
USER = {"role": "user", "content": "what is in it?"}

# (name, messages): every shape either side accepted before, and the ones at the edges
SHAPES: list[tuple[str, Any]] = [
    ("plain", [USER]),
    ("system and user", [{"role": "system", "content": "be brief"}, USER]),
    (
        "content parts: text and image",
        [{"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]}],
    ),
    ("content parts: empty list", [{"role": "user", "content": []}, USER]),
    (
        "assistant with tool calls, content null",
        [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            USER,
        ],
    ),
    ("assistant, content null, no tool calls", [USER, {"role": "assistant", "content": None}, USER]),
    ("extra keys kept (name)", [{"role": "user", "content": "hi", "name": "ann"}]),
    ("user content null", [{"role": "user", "content": None}]),
    ("content a number", [{"role": "user", "content": 7}]),
    ("content parts: a string in the list", [{"role": "user", "content": ["look"]}]),
    ("content parts: a part without type", [{"role": "user", "content": [{"text": "look"}]}]),
    ("role unknown", [{"role": "robot", "content": "hi"}]),
    ("role missing", [{"content": "hi"}]),
    ("no content", [{"role": "user"}]),
    ("a turn that is a string", ["hi"]),
    ("empty", []),
    ("messages a string", "hi"),
]


def _generate_verdict(prompts: Path) -> str | None:
    from sglfleet.gen import scan_input

    scan = scan_input(prompts)
    return None if scan.ok else scan.errors[0].reason


@pytest.mark.parametrize(("name", "messages"), SHAPES, ids=[s[0] for s in SHAPES])
def test_every_prompt_shape_generate_accepts_merge_carries_through(
    tmp_path: Path, name: str, messages: Any
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": messages}}
    prompts.write_bytes(orjson.dumps(line) + b"\n")
    refused_by_generate = _generate_verdict(prompts)
    results = tmp_path / "results.jsonl"
    results.write_bytes(result_line("x", "r", _answer(), None, "batch_req_1"))
    merged = tmp_path / "merged.jsonl"
    try:
        merge(_existing(tmp_path / "e.jsonl"), results, prompts, merged, min_completion_tokens=1)
        refused_by_merge = None
    except DataError as exc:
        refused_by_merge = str(exc)
    if refused_by_generate is None:
        assert refused_by_merge is None, f"{name}: generate sends it, merge refuses: {refused_by_merge}"
        row = json.loads(merged.read_text().splitlines()[-1])
        assert row["conversations"][:-1] == messages, "the prompt's turns are kept as the prompt had them"
        assert row["conversations"][-1] == {"role": "assistant", "content": "an answer " * 10}
    else:
        assert refused_by_merge is not None, f"{name}: generate refuses it ({refused_by_generate}), merge not"
        assert refused_by_merge.endswith(refused_by_generate), (refused_by_merge, refused_by_generate)


def test_conversation_prompts_with_content_parts_merge_too(tmp_path: Path) -> None:
    """Conversation input (SpecForge's rows): the turns before the regenerated one, parts and all."""
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]},
        {"role": "assistant", "content": "old"},
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(orjson.dumps({"id": "x", "conversations": turns}) + b"\n")
    assert _generate_verdict(prompts) is None
    results = tmp_path / "results.jsonl"
    results.write_bytes(result_line("x", "r", _answer(), None, "batch_req_1"))
    merged = tmp_path / "merged.jsonl"
    merge(_existing(tmp_path / "e.jsonl"), results, prompts, merged, min_completion_tokens=1)
    row = json.loads(merged.read_text().splitlines()[-1])
    assert row["conversations"] == [
        copy.deepcopy(turns[0]),
        {"role": "assistant", "content": "an answer " * 10},
    ]
