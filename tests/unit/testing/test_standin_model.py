"""The stand-in's pieces in-process: tokenizer, deterministic model, admission scheduler."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from sglfleet_testing.standin.model import DeterministicModel
from sglfleet_testing.standin.scheduler import Scheduler
from sglfleet_testing.standin.tokenizer import EOS_TOKEN_ID, VOCAB, count_tokens

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("   ", 0),
        ("one", 1),
        ("one two\nthree\tfour", 4),
        ("abcdefgh", 1),
        ("abcdefghi", 2),
        ("x" * 17, 3),
    ],
)
def test_count_tokens(text, tokens):
    assert count_tokens(text) == tokens


def test_vocabulary_words_are_single_tokens():
    assert len(set(VOCAB)) == 256
    assert all(count_tokens(word) == 1 and " " not in word for word in VOCAB)


@pytest.mark.parametrize("prompt", [f"prompt number {i}" for i in range(50)])
def test_completion_tokens_match_the_text(prompt):
    model = DeterministicModel(seed=1, natural_tokens=(1, 60))
    for budget in (0, 1, 7, 40, 100):
        completion = model.complete(prompt, max_new_tokens=budget)
        assert count_tokens(completion.text) == completion.completion_tokens == len(completion.output_ids)
        assert completion.completion_tokens <= budget
        if completion.finish_type == "length":
            assert completion.completion_tokens == budget
        else:
            assert completion.matched == EOS_TOKEN_ID and completion.completion_tokens < budget


def test_a_larger_budget_extends_the_text():
    model = DeterministicModel(seed=4)
    texts = [model.complete("grow", max_new_tokens=n, ignore_eos=True).text for n in range(1, 40)]
    assert all(longer.startswith(shorter + " ") for shorter, longer in itertools.pairwise(texts))


@pytest.mark.parametrize("prompt", [f"stop case {i}" for i in range(30)])
def test_stop_strings_keep_the_count_consistent(prompt):
    model = DeterministicModel(seed=2)
    full = model.complete(prompt, max_new_tokens=30, ignore_eos=True).text
    for stop in (full[10:13], full[25:27], "a", "zz zz"):
        completion = model.complete(prompt, max_new_tokens=30, ignore_eos=True, stop=[stop])
        if completion.finish_type == "stop":
            assert completion.matched == stop
            assert full.startswith(completion.text + stop)
            assert count_tokens(completion.text + stop) == completion.completion_tokens
        else:
            assert stop not in full


def test_earliest_completed_stop_string_wins():
    model = DeterministicModel(seed=3)
    full = model.complete("p", max_new_tokens=20, ignore_eos=True).text
    late_start_early_end = full[8:10]
    early_start_late_end = full[6:30]
    completion = model.complete(
        "p", max_new_tokens=20, ignore_eos=True, stop=[early_start_late_end, late_start_early_end]
    )
    assert completion.matched == late_start_early_end


def test_scheduler_admits_fifo_and_survives_cancelled_waiters():
    async def scenario() -> None:
        scheduler = Scheduler(limit=1)
        order: list[str] = []

        async def job(name: str) -> None:
            await scheduler.acquire()
            try:
                order.append(name)
                await asyncio.sleep(0.01)
            finally:
                scheduler.release()

        first = asyncio.create_task(job("a"))
        await asyncio.sleep(0)
        waiters = [asyncio.create_task(job(name)) for name in "bcd"]
        await asyncio.sleep(0)
        assert (scheduler.running, scheduler.waiting) == (1, 3)
        waiters[1].cancel()  # "c" gives up while waiting
        await asyncio.gather(first, *waiters, return_exceptions=True)
        assert order == ["a", "b", "d"]
        assert (scheduler.running, scheduler.waiting) == (0, 0)

    asyncio.run(scenario())


def test_unlimited_scheduler_never_queues():
    async def scenario() -> None:
        scheduler = Scheduler(limit=None)
        for _ in range(100):
            await scheduler.acquire()
        assert (scheduler.running, scheduler.waiting) == (100, 0)

    asyncio.run(scenario())
