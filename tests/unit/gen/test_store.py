"""The output store: torn tails cut, done ids read back, one writer at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglfleet.gen import OutputStore, StoreError, result_line
from sglfleet.gen._ids import IdSet


def _body(cid: str, tokens: int = 3) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{cid}",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f'say "usage": {cid}\n'}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
    }


def _fill(path: Path, ids: list[str]) -> None:
    store = OutputStore(path)
    store.open()
    for cid in ids:
        body = _body(cid)
        store.add_result(cid, f"req-{cid}", body, json.dumps(body).encode())
    store.close()


def test_lines_are_openai_batch_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    _fill(out, ["a"])
    pretty = json.dumps(_body("b"), indent=2).encode()  # not compact: re-serialised, still one line
    store = OutputStore(out)
    store.open()
    store.add_result("b", "req-b", _body("b"), pretty)
    store.close()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == ["a", "b"]
    assert records[0]["id"] != records[1]["id"], "line ids are unique across runs"
    for r in records:
        assert r["id"].startswith("batch_req_") and r["error"] is None
        assert r["response"]["status_code"] == 200 and r["response"]["body"] == _body(r["custom_id"])


def test_resume_reads_done_ids_and_tokens(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    _fill(out, [f"id-{i}" for i in range(50)])
    store = OutputStore(out)
    resumed = store.open()
    store.close()
    assert resumed.lines == 50 and resumed.torn_bytes_cut == 0
    assert "id-0" in resumed.done and "id-49" in resumed.done and "id-50" not in resumed.done
    assert (resumed.prompt_tokens, resumed.completion_tokens) == (500, 150)


@pytest.mark.parametrize("tail", [b'{"id":"batch_req_1","custom_id":"torn', b"\x00\x00\x00", b"{"])
def test_torn_last_line_is_cut(tmp_path: Path, tail: bytes) -> None:
    out = tmp_path / "out.jsonl"
    _fill(out, ["a", "b"])
    whole = out.read_bytes()
    with out.open("ab") as fh:
        fh.write(tail)
    resumed = OutputStore(out).open()
    assert resumed.torn_bytes_cut == len(tail) and resumed.lines == 2
    assert out.read_bytes() == whole


def test_garbage_last_line_with_newline_is_cut(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    _fill(out, ["a"])
    whole = out.read_bytes()
    with out.open("ab") as fh:
        fh.write(b"\x00\x00\x00\n")
    store = OutputStore(out)
    assert store.open().lines == 1
    store.close()
    assert out.read_bytes() == whole


def test_corruption_in_the_middle_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    _fill(out, ["a"])
    with out.open("ab") as fh:
        fh.write(b"garbage\n")
    with out.open("ab") as fh:
        fh.write(result_line("c", "r", {"x": 1}, None, "batch_req_x"))
    with pytest.raises(StoreError, match="line 2 is not an output record"):
        OutputStore(out).open()


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    first = OutputStore(out)
    first.open()
    with pytest.raises(StoreError, match="locked"):
        OutputStore(out).open()
    first.close()
    OutputStore(out).open()


def test_errors_file_holds_only_the_latest_run(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    store = OutputStore(out)
    store.open()
    store.add_error("x", "http_error", "HTTP 400: bad", 400, {"message": "bad"})
    store.close()
    record = json.loads(store.errors_path.read_text())
    assert record["custom_id"] == "x" and record["error"]["message"] == "HTTP 400: bad"
    assert record["response"]["status_code"] == 400
    store = OutputStore(out)
    store.open()
    store.close()
    assert store.errors_path.read_text() == ""


def test_idset_membership_and_repeats() -> None:
    ids = IdSet()
    for cid in ["a", "b", "c", "b"]:
        ids.add(cid)
    ids.freeze()
    assert len(ids.repeated) == 1
    assert "a" in ids and "b" in ids and "z" not in ids and len(ids) == 3


def test_resume_reads_ids_and_tokens_of_well_formed_results_only(tmp_path: Path) -> None:
    """Our lines and a foreign success line count; a 200 without choices and a line without a
    status are not results, so their ids are sent again (sglfleet.records.result_of)."""
    out = tmp_path / "out.jsonl"
    compact = (
        b'{"choices":[{"message":{"content":"a \\"usage\\": 7"}}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":4}}'
    )
    spaced = {"choices": [{"text": "x"}], "usage": {"completion_tokens": 5, "prompt_tokens": 2}}
    foreign = {"custom_id": "three", "response": {"status_code": 200, "body": {"choices": [{"text": "y"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1}}}}  # fmt: skip
    with out.open("wb") as fh:
        fh.write(result_line('id "quoted"', "r1", None, compact, "batch_req_1"))
        fh.write(result_line("two", "r2", spaced, None, "batch_req_2", conversations=[{"role": "user"}]))
        fh.write(json.dumps(foreign).encode() + b"\n")
        fh.write(result_line("four", "r4", {"choices": []}, None, "batch_req_4"))
        fh.write(json.dumps({"custom_id": "five", "response": {"body": {"choices": [{}]}}}).encode() + b"\n")
    store = OutputStore(out)
    resumed = store.open()
    store.close()
    assert resumed.lines == 3 and resumed.prompt_tokens == 6 and resumed.completion_tokens == 10
    assert all(x in resumed.done for x in ('id "quoted"', "two", "three"))
    assert "four" not in resumed.done and "five" not in resumed.done


def test_a_result_written_twice_is_refused_naming_the_id_and_its_lines(tmp_path: Path) -> None:
    """A results file with two successes for one id (a line pasted twice by hand, two files
    concatenated) is refused before anything is sent, and the message says which id and where, so that
    it can be repaired (a second reader's hostile shape, issue 28: it named neither)."""
    out = tmp_path / "out.jsonl"
    _fill(out, ["a", "b", "c"])
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join([*lines, lines[1]]))
    with pytest.raises(StoreError, match=r"1 custom_id\(s\) more than once \(id 'b' on lines 2, 4\)"):
        OutputStore(out).open()
    assert out.read_bytes().count(b"\n") == 4  # left as it was
