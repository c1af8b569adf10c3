"""Sources and formats of `sglfleet mix`: JSONL, JSON, Parquet, saved HF datasets; the four adapters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sglfleet.data import (
    DataError,
    Format,
    NearDeduper,
    RowError,
    SourceType,
    build_mix,
    classify,
    parse_config,
    read_rows,
    to_messages,
)

pytestmark = pytest.mark.timeout(60)


def test_sharegpt_prompt_keeps_the_context_up_to_the_last_user_turn() -> None:
    row = {
        "conversations": [
            {"from": "system", "value": "Be kind."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": "Tell me a joke."},
            {"from": "gpt", "value": "Why did..."},
        ]
    }
    assert to_messages(row, Format.SHAREGPT) == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me a joke."},
    ]


def test_openai_content_parts_alpaca_input_and_plain_prompt() -> None:
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image_url"}]}]
    }
    assert to_messages(parts, Format.OPENAI) == [{"role": "user", "content": "Look"}]
    alpaca = {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}
    assert to_messages(alpaca, Format.ALPACA) == [
        {"role": "user", "content": "Translate to French.\n\nGood morning"}
    ]
    assert to_messages({"q": "Why?"}, Format.PROMPT, "q") == [{"role": "user", "content": "Why?"}]
    with pytest.raises(RowError, match=r"row has no field 'prompt' \(fields: q\)"):
        to_messages({"q": "Why?"}, Format.PROMPT)
    with pytest.raises(RowError, match=r"conversations\[0\]: unknown speaker 'robot'"):
        to_messages({"conversations": [{"from": "robot", "value": "x"}]}, Format.SHAREGPT)


def _mix_one(tmp_path: Path, path: Path, fmt: str, quota: int, **extra: object) -> list[dict]:
    config = parse_config(
        {"sources": [{"name": "s", "path": str(path), "format": fmt, "quota": quota, **extra}]}
    )
    build_mix(config, tmp_path / "out.jsonl")
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]


def test_parquet_source_is_read_in_batches(tmp_path: Path) -> None:
    texts = [f"Parquet prompt number {i} about topic {i * 13}" for i in range(5000)]
    pq.write_table(
        pa.table({"instruction": texts, "input": [""] * 5000}), tmp_path / "a.parquet", row_group_size=700
    )
    assert sum(1 for _ in read_rows(tmp_path / "a.parquet", SourceType.PARQUET)) == 5000
    rows = _mix_one(tmp_path, tmp_path / "a.parquet", "alpaca", 4321)
    assert len(rows) == 4321
    index = int(rows[-1]["custom_id"].split("-")[1])
    assert rows[-1]["body"]["messages"][0]["content"] == texts[index]


def test_json_array_source(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "One question?"}, {"prompt": "Two questions?"}]))
    assert len(_mix_one(tmp_path, tmp_path / "a.json", "prompt", 2)) == 2
    (tmp_path / "b.json").write_text('{"a": 1}')
    with pytest.raises(DataError, match=r"source 's': .*b\.json: expected a JSON array"):
        _mix_one(tmp_path, tmp_path / "b.json", "prompt", 1)


def test_saved_hugging_face_dataset_source(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    conversations = [
        [{"from": "human", "value": f"HF question {i}?"}, {"from": "gpt", "value": "A"}] for i in range(9)
    ]
    datasets.Dataset.from_dict({"conversations": conversations}).save_to_disk(tmp_path / "ds")
    rows = _mix_one(tmp_path, tmp_path / "ds", "sharegpt", 9)
    assert sorted(r["body"]["messages"][0]["content"] for r in rows) == [
        f"HF question {i}?" for i in range(9)
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["p1", "p2"]})}).save_to_disk(
        tmp_path / "dd"
    )
    with pytest.raises(
        DataError, match=r"source 's': .*dd: a DatasetDict with splits \['train'\]; set split"
    ):
        _mix_one(tmp_path, tmp_path / "dd", "prompt", 1)
    assert len(_mix_one(tmp_path, tmp_path / "dd", "prompt", 2, split="train")) == 2


def test_near_deduper_flags_small_edits_not_different_texts() -> None:
    near = NearDeduper(threshold=0.7)
    base = "Describe the life cycle of a star from the nebula stage through to a white dwarf or black hole"
    near.add(base)
    near.add(base + " in detail")
    near.add("List the planets of the solar system in order of their distance from the sun")
    assert near.resolve() == [None, "near", None]


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("Write a Python function that merges two sorted lists.", "code"),
        ("Fix this:\n```\nint main() { return 0 }\n```", "code"),
        ("Solve for x: 3x + 7 = 22", "math"),
        ("Riddle: what has keys but can't open locks? Think step by step.", "reasoning"),
        ("Write a short poem about the sea at night.", "writing"),
        ("¿Cuál es la mejor época para visitar Sevilla y qué ver en la ciudad?", "multilingual"),
        ("東京でおすすめのラーメン屋を教えてください。", "multilingual"),
        ("What is a good name for a golden retriever puppy?", "chat"),
    ],
)
def test_classifier(text: str, category: str) -> None:
    assert classify(text) == category


def test_parquet_reads_the_mapped_columns_and_names_them_all_when_one_is_missing(tmp_path: Path) -> None:
    table = pa.table({"question": ["What is a quark?"], "answer": ["A particle."], "meta": [{"a": 1}]})
    pq.write_table(table, tmp_path / "q.parquet")
    assert [
        row for _, row in read_rows(tmp_path / "q.parquet", SourceType.PARQUET, columns=("question",))
    ] == [{"question": "What is a quark?"}]
    with pytest.raises(
        DataError, match=r"q\.parquet row 0: row has no field 'prompt' \(fields: answer, meta, question\)"
    ):
        _mix_one(tmp_path, tmp_path / "q.parquet", "prompt", 1)
    assert _mix_one(tmp_path, tmp_path / "q.parquet", "prompt", 1, field="question")[0]["body"][
        "messages"
    ] == [{"role": "user", "content": "What is a quark?"}]


def test_a_saved_dataset_without_the_datasets_package_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ds").mkdir()
    monkeypatch.setitem(sys.modules, "datasets", None)  # what an environment without it looks like
    with pytest.raises(DataError, match=r"source 's': .*ds: reading a saved Hugging Face dataset needs"):
        _mix_one(tmp_path, tmp_path / "ds", "prompt", 1)
