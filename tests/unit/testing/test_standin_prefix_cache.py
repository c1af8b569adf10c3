"""The stand-in's prefix cache: reuse of the longest cached prefix, a token budget, LRU eviction, the
prefill time a hit saves, and `/metrics` reporting hits the way SGLang 0.5.12 does."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sglfleet_testing.standin.prefix_cache import PAGE_WORDS, PrefixCache
from sglfleet_testing.standin.process import running_standin

pytestmark = pytest.mark.timeout(60)


def words(tag: str, n: int) -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_longest_cached_prefix_is_matched_page_by_page():
    cache = PrefixCache(budget=10_000)
    system = words("sys", 3 * PAGE_WORDS)
    assert cache.match_insert([*system, *words("a", 10)]) == 0
    # a second prompt with the same system prompt reuses its three full pages, not the rest
    assert cache.match_insert([*system, *words("b", 10)]) == 3 * PAGE_WORDS
    # the same prompt again: all of it
    assert cache.match_insert([*system, *words("b", 10)]) == 3 * PAGE_WORDS + 10
    # a prompt that differs in its first word shares nothing
    assert cache.match_insert(["x", *system[1:]]) == 0


def test_long_words_count_one_token_per_eight_characters():
    cache = PrefixCache(budget=10_000)
    page = ["a" * 20] * PAGE_WORDS  # 3 tokens each
    cache.match_insert(page)
    assert cache.match_insert(page) == 3 * PAGE_WORDS
    assert cache.size == 3 * PAGE_WORDS


def test_budget_evicts_least_recently_used_leaves_first():
    cache = PrefixCache(budget=4 * PAGE_WORDS)
    shared = words("s", PAGE_WORDS)
    a, b, c = ([*shared, *words(t, PAGE_WORDS)] for t in "abc")
    cache.match_insert(a)
    cache.match_insert(b)  # shared page + b's leaf: 3 pages held
    assert cache.size == 3 * PAGE_WORDS
    cache.match_insert(a)  # a used again: b's leaf is now the least recently used
    cache.match_insert(c)  # a fourth page fits exactly
    cache.insert(words("d", PAGE_WORDS))  # a fifth does not: b's leaf goes, not the shared page
    assert cache.size <= cache.budget
    assert cache.evicted == PAGE_WORDS
    assert cache.match_insert(a) == 2 * PAGE_WORDS
    assert cache.match_insert(c) == 2 * PAGE_WORDS


def test_budget_zero_caches_nothing():
    cache = PrefixCache(budget=0)
    cache.match_insert(words("a", 40))
    assert cache.match_insert(words("a", 40)) == 0
    assert len(cache) == 0


def _metrics(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _chat(client: httpx.Client, messages: list[dict]) -> dict:
    body = {"model": "m", "messages": messages, "max_tokens": 8, "ignore_eos": True}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_next_turn_finds_the_previous_turn_and_its_answer_cached():
    system = " ".join(words("rule", 200))
    with running_standin(enable_metrics=True) as url, httpx.Client(base_url=url) as client:
        first = [{"role": "system", "content": system}, {"role": "user", "content": "question one"}]
        one = _chat(client, first)
        answer = one["choices"][0]["message"]["content"]
        second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "two"}]
        meta = client.post(
            "/generate",
            json={
                "text": _render(second),
                "sampling_params": {"max_new_tokens": 4},
            },
        ).json()["meta_info"]
        # all but the last page (which the new user turn changed) comes from the cache
        assert meta["prompt_tokens"] - PAGE_WORDS <= meta["cached_tokens"] < meta["prompt_tokens"]
        m = _metrics(client)
        # SGLang's gauge: the latest prefill's hit / (hit + new) tokens
        assert m["sglang:cache_hit_rate"] == pytest.approx(meta["cached_tokens"] / meta["prompt_tokens"])
        assert m["sglang:cached_tokens_total"] == meta["cached_tokens"]
        assert m["sglang:prompt_tokens_total"] == one["usage"]["prompt_tokens"] + meta["prompt_tokens"]


def _render(messages: list[dict]) -> str:
    """The stand-in's chat template (protocol.ChatRequest.render)."""
    return "".join(f"<|{m['role']}|> {m['content']}\n" for m in messages) + "<|assistant|>"


def test_a_cached_prefix_skips_its_prefill_time():
    prompt = " ".join(words("w", 2000))  # 2000 tokens at 4000 tokens/s: 0.5 s of prefill
    flags = {"standin_prefill_tps": 4000, "enable_metrics": True}
    with running_standin(**flags) as url, httpx.Client(base_url=url, timeout=30) as client:

        def timed(text: str) -> tuple[float, dict]:
            started = time.perf_counter()
            response = client.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
            return time.perf_counter() - started, response.json()["meta_info"]

        cold, cold_meta = timed(prompt)
        warm, warm_meta = timed(prompt + " and a new question")
        assert cold_meta["cached_tokens"] == 0
        assert warm_meta["cached_tokens"] == 2000
        assert cold >= 0.5
        assert warm < cold / 2


def test_cache_budget_flag_bounds_what_is_reused():
    prompt_a = " ".join(words("a", 4 * PAGE_WORDS))
    prompt_b = " ".join(words("b", 4 * PAGE_WORDS))
    with (
        running_standin(standin_prefix_cache_tokens=5 * PAGE_WORDS) as url,
        httpx.Client(base_url=url) as client,
    ):

        def cached(text: str) -> int:
            body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
            return client.post("/generate", json=body).json()["meta_info"]["cached_tokens"]

        cached(prompt_a)
        assert cached(prompt_a) == 4 * PAGE_WORDS - 1
        cached(prompt_b)  # B's pages push out A's oldest (its leaves first)
        assert cached(prompt_a) < 4 * PAGE_WORDS - 1
        info = client.get("/server_info").json()
        assert info["standin"]["prefix_cache_tokens"] == 5 * PAGE_WORDS
