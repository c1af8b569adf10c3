"""SpecForge's round trip: its conversation JSONL in → `sglfleet generate` → `sglfleet merge` → rows.

The input is what SpecForge's `scripts/regenerate_train_data.py` reads (`{"id", "conversations":
[{role, content}, ...]}`); with `--turns all` every assistant turn is regenerated in order from the
regenerated conversation before it, as that script does (system and user turns kept, old assistant
turns dropped). The results then merge into the training set without a prompts file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.generate import get_json, latency_servers, run_job

from sglfleet.data import merge
from sglfleet.gen import ExitCode, GenParams

pytestmark = pytest.mark.timeout(60)

CONVERSATIONS = [
    {
        "id": "sf-1",
        "conversations": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "old answer 1"},
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "old answer 2"},
        ],
    },
    {"id": 2, "conversations": [{"role": "user", "content": "only question"}]},
]


def _write(path: Path, rows: list[dict]) -> None:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_every_assistant_turn_regenerated_then_merged(tmp_path: Path) -> None:
    inp, out, existing, merged = (tmp_path / n for n in ("in.jsonl", "out.jsonl", "old.jsonl", "new.jsonl"))
    _write(inp, CONVERSATIONS)
    _write(
        existing,
        [
            {
                "id": "old-1",
                "conversations": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ],
            }
        ],
    )
    params = GenParams(
        model="target",
        max_tokens=64,
        extra={"top_k": 20, "chat_template_kwargs": {"enable_thinking": True}},
        turns="all",
        keep_reasoning=True,
    )
    with latency_servers(1, 0.0, "ok") as urls:
        outcome = run_job(inp, out, urls, params=params)
        bodies = get_json(urls[0] + "/bodies")
    assert outcome.exit_code == ExitCode.OK, outcome.message
    assert len(bodies) == 3  # two turns of sf-1, one of 2
    assert all(b["top_k"] == 20 and b["chat_template_kwargs"] == {"enable_thinking": True} for b in bodies)
    assert all(b["model"] == "target" and b["max_tokens"] == 64 for b in bodies)
    second = next(b for b in bodies if b["messages"][-1]["content"] == "second question")
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "answer to first question", "built on the regenerated turn"

    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    conv = rows["sf-1"]["conversations"]
    assert [t["content"] for t in conv] == [
        "be brief",
        "first question",
        "answer to first question",
        "second question",
        "answer to second question",
    ]
    assert conv[2]["reasoning_content"].startswith("thought ")
    assert rows["sf-1"]["response"]["body"]["usage"]["completion_tokens"] == 40, "summed over both turns"
    assert outcome.manifest is not None and outcome.manifest.tokens.completion == 60
    assert outcome.manifest.params["turns"] == "all"

    report = merge(existing, out, None, merged, min_completion_tokens=17)
    new = [json.loads(x) for x in merged.read_text().splitlines()]
    assert new[0]["id"] == "old-1" and len(new) == 3
    by_id = {r["id"]: r for r in new}
    assert by_id["sf-1"]["conversations"] == conv
    assert by_id["2"]["conversations"][-1]["content"] == "answer to only question"
    assert report.results_read == 2


def test_the_last_turn_mode_keeps_the_conversation_too(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, CONVERSATIONS)
    with latency_servers(1, 0.0, "ok") as urls:
        outcome = run_job(inp, out, urls)
    assert outcome.exit_code == ExitCode.OK
    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert [t["content"] for t in rows["sf-1"]["conversations"]] == [
        "be brief",
        "first question",
        "old answer 1",
        "second question",
        "answer to second question",
    ]
    assert "reasoning_content" not in rows["sf-1"]["conversations"][-1]


def test_all_turns_refuses_what_specforge_refuses(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(
        inp,
        [
            {
                "id": "a",
                "conversations": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
            }
        ],
    )
    outcome = run_job(inp, out, ["http://127.0.0.1:9"], params=GenParams(turns="all"))
    assert outcome.exit_code == ExitCode.BAD_INPUT
    assert "conversations[0] is an assistant turn" in str(outcome.input_errors[0])
