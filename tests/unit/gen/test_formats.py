"""Input formats: detection per file, every bad line reported with its number, requests streamed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.gen import GenParams, InputFormat, iter_requests, scan_input


def _write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _batch(cid: str, url: str = "/v1/chat/completions", **body: object) -> dict[str, object]:
    body = body or {"messages": [{"role": "user", "content": f"hello {cid}"}]}
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def _conv(cid: object, *turns: tuple[str, str]) -> dict[str, object]:
    return {"id": cid, "conversations": [{"role": r, "content": c} for r, c in turns]}


def test_batch_file_is_detected_and_streamed_with_the_flags_set(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [_batch("a"), "", _batch("b", "/v1/completions", prompt="once upon", max_tokens=7)],
    )
    scan = scan_input(path)
    assert scan.ok, scan.errors
    assert (scan.format, scan.requests) == (InputFormat.BATCH, 2)
    reqs = list(iter_requests(path, scan.format, GenParams(model="m", max_tokens=64)))
    assert [(r.custom_id, r.url) for r in reqs] == [("a", "/v1/chat/completions"), ("b", "/v1/completions")]
    first, second = (json.loads(r.body) for r in reqs)
    assert first["model"] == "m" and first["max_tokens"] == 64
    assert second["max_tokens"] == 64, "what the command line gives wins over the body's own value"
    assert second["prompt"] == "once upon"


def test_conversation_regenerates_the_last_assistant_turn(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            _conv("c1", ("system", "be brief"), ("user", "hi"), ("assistant", "old answer")),
            _conv(7, ("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")),
            _conv("c3", ("user", "no answer yet")),
        ],
    )
    scan = scan_input(path)
    assert scan.ok and scan.format is InputFormat.CONVERSATION
    reqs = {r.custom_id: json.loads(r.body) for r in iter_requests(path, scan.format, GenParams())}
    assert reqs["c1"]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert [m["content"] for m in reqs["7"]["messages"]] == ["q1", "a1", "q2"]
    assert reqs["c3"]["messages"] == [{"role": "user", "content": "no answer yet"}]


def test_skip_drops_done_ids(tmp_path: Path) -> None:
    path = _write(tmp_path, [_batch(str(i)) for i in range(5)])
    scan = scan_input(path)
    kept = [r.custom_id for r in iter_requests(path, scan.format, GenParams(), skip={"1", "3"}.__contains__)]
    assert kept == ["0", "2", "4"]


BAD_CORPUS: list[tuple[object, str]] = [
    (_batch("ok-1"), ""),
    ("{not json", "bad JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions"}, "missing field body"),
    (_batch("e1", messages=[]), "body.messages is empty"),
    (_batch("u1", "/v1/embeddings"), "unsupported url '/v1/embeddings'"),
    ({**_batch("g1"), "method": "GET"}, "unsupported method 'GET'"),
    (_batch("ok-1"), "duplicate id 'ok-1' (first on line 1)"),
    (_batch("r1", messages=[{"role": "robot", "content": "x"}]), "body.messages[0].role is 'robot'"),
    (_batch("p1", "/v1/completions", prompt=""), "body.prompt is empty"),
    (_conv("c1", ("user", "hi")), "line is conversation format but the file is openai-batch"),
    ({"hello": 1}, "neither OpenAI Batch"),
    ({**_batch(""), "custom_id": ""}, "custom_id must be a non-empty string"),
    (_batch("ok-2"), ""),
]


def test_bad_corpus_reports_every_bad_line_with_its_number(tmp_path: Path) -> None:
    path = _write(tmp_path, [line for line, _ in BAD_CORPUS])
    scan = scan_input(path)
    expected = {n: why for n, (_, why) in enumerate(BAD_CORPUS, start=1) if why}
    got = {e.line: e.reason for e in scan.errors}
    assert sorted(got) == sorted(expected)
    for line, why in expected.items():
        assert why in got[line], (line, got[line])


@pytest.mark.parametrize(
    ("turns", "why"),
    [
        ([], "conversations is empty"),
        ([("assistant", "a")], "no turns before the assistant turn"),
        ([("system", "s"), ("assistant", "a")], "is 'system', not user"),
    ],
)
def test_bad_conversations(tmp_path: Path, turns: list[tuple[str, str]], why: str) -> None:
    path = _write(tmp_path, [_conv("ok", ("user", "u")), _conv("bad", *turns)])
    scan = scan_input(path)
    assert [e.line for e in scan.errors] == [2]
    assert why in scan.errors[0].reason


def test_empty_input_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, ["", "  "])
    scan = scan_input(path)
    assert not scan.ok and "no requests" in scan.errors[0].reason


def test_hash_changes_with_content(tmp_path: Path) -> None:
    path = _write(tmp_path, [_batch("a")])
    first = scan_input(path).sha256
    path.write_text(path.read_text().replace("hello", "hullo"))
    assert scan_input(path).sha256 != first


def test_a_trusted_hash_skips_the_checks_only_for_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    rows = [{"id": i, "conversations": [{"role": "user", "content": f"q{i}"}]} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    full = scan_input(path)
    quick = scan_input(path, trusted_sha256=full.sha256)
    assert (quick.sha256, quick.requests, quick.size, list(quick.lines.ids)) == (
        full.sha256,
        full.requests,
        full.size,
        list(full.lines.ids),
    )
    # a line that only the checks refuse (a bad role): trusted by a stale hash, it is still checked
    with path.open("a") as fh:
        fh.write(json.dumps({"id": 9, "conversations": [{"role": "robot", "content": "x"}]}) + "\n")
    again = scan_input(path, trusted_sha256=full.sha256)
    assert not again.ok and "role is 'robot'" in str(again.errors[0])


def test_stream_true_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    path.write_text(
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body})
    )
    scan = scan_input(path)
    assert (
        str(scan.errors[0]) == 'line 1: body.stream is true: a batch job needs whole answers, remove "stream"'
    )
