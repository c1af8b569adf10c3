"""Near duplicates: MinHash signatures, the LSH plan chosen for recall, confirmation by estimated
Jaccard, and near duplicates of the existing set; measured on pairs planted at known similarity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from datasketch import MinHash
from sglfleet_testing.textgen import Words, planted_pair

from sglfleet.data import build_mix, parse_config
from sglfleet.data._dedupe import NearDeduper, Signer, plan_lsh, shingles

pytestmark = pytest.mark.timeout(120)


def test_signatures_are_datasketch_minhashes_of_the_shingles() -> None:
    signer = Signer(128)
    texts = ["Explain how a heat pump works in winter, step by step", "hi", "", "a b c", "one two three four"]
    hashes = signer.shingle_hashes(texts)
    values = signer.from_hashes(hashes)
    for text, mine, row in zip(texts, hashes, values, strict=True):
        assert len(set(mine.tolist())) == len(shingles(text))
        reference = MinHash(num_perm=128, seed=1, scheme="affine32", hashfunc=int)
        reference.update_batch(mine.tolist())
        assert np.array_equal(reference.hashvalues, row)


@pytest.mark.parametrize("threshold", [0.7, 0.75, 0.8, 0.85, 0.9, 0.95])
def test_auto_plan_reaches_the_recall_goal_with_the_fewest_permutations(threshold: float) -> None:
    plan = plan_lsh(threshold)
    assert plan.expected_recall >= 0.995, plan
    assert plan.expected_false_drops <= 0.005, plan
    assert plan.bands * plan.rows <= plan.num_perm
    fewer = [k for k in (128, 192, 256, 320, 384, 448, 512) if k < plan.num_perm]
    for k in fewer:  # auto took the smallest signature that meets the goal
        smaller = plan_lsh(threshold, k)
        assert smaller.expected_recall < 0.995 or smaller.expected_false_drops > 0.005
    # below 0.7 even 512 permutations fall short of the goal: the largest is taken (and reported)
    assert plan_lsh(0.6).num_perm == 512 and plan_lsh(0.6).expected_recall > 0.98
    # what the old fixed 64 permutations (5 bands x 11 rows, no confirmation) promised at 0.8
    assert 1 - (1 - 0.85**11) ** 5 < 0.65


def test_planted_pairs_recall_and_false_drops() -> None:
    """Pairs at Jaccard >= t + 0.05 are dropped (>= 99%), pairs at <= t - 0.1 are kept (>= 99%),
    against earlier candidates and against the existing set alike; unrelated texts are all kept."""
    threshold, rng, words = 0.8, random.Random(11), Words()
    high = [
        planted_pair(rng, words, rng.uniform(threshold + 0.05, threshold + 0.1), True) for _ in range(400)
    ]
    low = [planted_pair(rng, words, rng.uniform(0.4, threshold - 0.1), False) for _ in range(400)]
    assert all(j >= threshold + 0.05 for _, _, j in high) and all(j <= threshold - 0.1 for _, _, j in low)
    near = NearDeduper(threshold)
    existing_side = high[:200] + low[:200]
    for first, _, _ in existing_side:
        near.add(first, existing=True)
    within = high[200:] + low[200:]
    offered = [first for first, _, _ in within]
    offered += [" ".join(words.take(rng.randint(20, 120))) for _ in range(1000)]  # unrelated
    offered += [second for _, second, _ in existing_side + within]
    for text in offered:
        near.add(text)
    verdict = dict(zip(offered, near.resolve(), strict=True))
    assert all(verdict[first] is None for first, _, _ in within)  # the first of a pair is kept
    assert sum(v is not None for v in verdict.values()) == sum(
        verdict[s] is not None for _, s, _ in high + low
    )
    found = [verdict[second] for _, second, _ in high]
    assert sum(v is not None for v in found) / len(found) >= 0.99
    assert {verdict[s] for _, s, _ in high[:200]} <= {"near_existing", None}
    assert {verdict[s] for _, s, _ in high[200:]} <= {"near", None}
    false = [verdict[second] for _, second, _ in low]
    assert sum(v is not None for v in false) / len(false) <= 0.01
    rows = near.existing + near.candidates  # one byte per permutation, in blocks that grow by doubling
    assert rows * near.num_perm <= near.nbytes < 2 * rows * near.num_perm


def test_signatures_kept_in_blocks_are_found_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglfleet.data import _dedupe

    monkeypatch.setattr(_dedupe, "_BLOCK_ROWS", 8)
    monkeypatch.setattr(_dedupe, "_BATCH_ROWS", 3)
    words = Words()
    texts = [" ".join(words.take(30)) for _ in range(40)]
    near = NearDeduper(0.8, 128)
    for text in texts:
        near.add(text)
    near._flush()
    assert [len(b) for b in near._blocks] == [8, 8, 8, 8, 8]
    index = np.array([39, 0, 17, 8, 7, 31])
    assert np.array_equal(near._rows(index), Signer(128).bbit([texts[i] for i in index]))
    near.add(texts[5] + " again")
    assert near.resolve()[-1] == "near"


def test_a_candidate_dropped_as_near_does_not_drop_the_next_one() -> None:
    """Only kept texts count as the earlier one: in a chain a ~ b ~ c with a !~ c, a and c are kept."""
    stream = Words().take(148)
    a, b, c = (" ".join(stream[start : start + 100]) for start in (0, 24, 48))

    def jaccard(x: str, y: str) -> float:
        return len(shingles(x) & shingles(y)) / len(shingles(x) | shingles(y))

    assert jaccard(a, b) == jaccard(b, c) == 74 / 122 and jaccard(a, c) == 50 / 146
    near = NearDeduper(0.5)
    for text in (a, b, c):
        near.add(text)
    assert near.resolve() == [None, "near", None]


def test_mix_drops_near_duplicates_of_the_existing_set(tmp_path: Path) -> None:
    words = Words()
    known = " ".join(words.take(60))
    existing = tmp_path / "existing.jsonl"
    existing.write_text(json.dumps({"conversations": [{"role": "user", "content": known}]}) + "\n")
    fresh = [" ".join(words.take(60)) for _ in range(3)]
    rows = [{"prompt": known + " please"}, *({"prompt": t} for t in fresh)]
    source = tmp_path / "s.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "existing": {"path": str(existing)},
        "dedupe": {"near": {"enabled": True, "threshold": 0.8}},
        "sources": [{"name": "s", "path": str(source), "format": "prompt", "quota": 3}],
    }
    report = build_mix(parse_config(config), tmp_path / "out.jsonl").as_dict()
    assert report["sources"][0]["duplicates_by_kind"] == {"near_existing": 1}
    assert report["sources"][0]["available"] == 3
    assert any("384 permutations" in n and "expected recall 99.57%" in n for n in report["notes"])
    written = [json.loads(line)["body"]["messages"][0]["content"] for line in (tmp_path / "out.jsonl").open()]
    assert sorted(written) == sorted(fresh)
    config["dedupe"]["against_existing"] = False
    config["sources"][0]["quota"] = 4
    report = build_mix(parse_config(config), tmp_path / "out2.jsonl").as_dict()
    assert report["sources"][0]["duplicates"] == 0


def test_explicit_num_perm_is_kept_and_its_expected_recall_reported(tmp_path: Path) -> None:
    source = tmp_path / "s.jsonl"
    source.write_text(json.dumps({"prompt": "just one prompt here"}) + "\n")
    config = {
        "dedupe": {"near": {"enabled": True, "threshold": 0.8, "num_perm": 64}},
        "sources": [{"name": "s", "path": str(source), "format": "prompt", "quota": 1}],
    }
    report = build_mix(parse_config(config), tmp_path / "out.jsonl")
    (note,) = report.notes
    plan = plan_lsh(0.8, 64)
    assert f"64 permutations ({plan.bands} bands x {plan.rows} rows" in note
    assert f"expected recall {100 * plan.expected_recall:.2f}%" in note and plan.expected_recall < 0.99


@pytest.mark.parametrize("copies", [1_001, 3_001])
def test_a_cluster_of_near_copies_keeps_one_whatever_its_size(copies: int) -> None:
    """Every near copy of one prompt is dropped, however many there are (an LSH bucket that big is
    settled against the rows it kept, not a window of the rows before), and the rows around it are
    kept; a near copy of an existing row is dropped as such whatever the cluster's size."""
    words = Words()
    base = words.take(60)
    extra = words.take(copies)
    cluster = [" ".join([*base, word]) for word in extra]  # Jaccard >= 0.93 between any two
    unrelated = [" ".join(words.take(40)) for _ in range(300)]
    near = NearDeduper(0.8)
    offered = [*unrelated[:150], *cluster, *unrelated[150:]]
    for text in offered:
        near.add(text)
    verdicts = dict(zip(offered, near.resolve(), strict=True))
    assert [t for t in cluster if verdicts[t] is None] == [cluster[0]]
    assert {verdicts[t] for t in cluster[1:]} == {"near"}
    assert all(verdicts[t] is None for t in unrelated)

    near = NearDeduper(0.8)
    near.add(" ".join(base), existing=True)
    for text in offered:
        near.add(text)
    verdicts = dict(zip(offered, near.resolve(), strict=True))
    assert {verdicts[t] for t in cluster} == {"near_existing"}
    assert all(verdicts[t] is None for t in unrelated)


def test_a_cluster_in_the_existing_set_drops_every_candidate_near_it() -> None:
    """Near copies in the existing set (a big bucket of existing rows) are all kept, and every
    candidate near them is dropped as near_existing; candidates near nothing are kept."""
    words = Words()
    base = words.take(60)
    near = NearDeduper(0.8)
    for word in words.take(300):
        near.add(" ".join([*base, word]), existing=True)
    candidates = [" ".join([*base, *words.take(2)]) for _ in range(200)]
    fresh = [" ".join(words.take(50)) for _ in range(50)]
    for text in candidates + fresh:
        near.add(text)
    assert near.resolve() == ["near_existing"] * len(candidates) + [None] * len(fresh)
