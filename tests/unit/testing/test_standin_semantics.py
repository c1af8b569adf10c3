"""What clients rely on: determinism, token counts, max tokens, stop, context length, streaming."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
from sglfleet_testing.standin.process import running_standin
from sglfleet_testing.standin.tokenizer import EOS_TOKEN_ID, count_tokens

pytestmark = pytest.mark.timeout(60)

CONTEXT = 256


@pytest.fixture(scope="module")
def client():
    with running_standin(context_length=CONTEXT, standin_seed=7) as url, httpx.Client(base_url=url) as http:
        yield http


def generate(client: httpx.Client, text: str, **params) -> dict:
    response = client.post("/generate", json={"text": text, "sampling_params": params})
    assert response.status_code == 200, response.text
    return response.json()


def chat(client: httpx.Client, content: str, **fields) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return client.post("/v1/chat/completions", json=body)


def sse_events(response: httpx.Response) -> list:
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_same_request_same_text(client):
    first = generate(client, "Tell me a story", max_new_tokens=40)
    again = generate(client, "Tell me a story", max_new_tokens=40)
    assert first["text"] == again["text"] and first["output_ids"] == again["output_ids"]
    assert generate(client, "Tell me a story.", max_new_tokens=40)["text"] != first["text"]


def test_text_depends_on_the_server_seed(client):
    ours = generate(client, "seeded", max_new_tokens=20, ignore_eos=True)["text"]
    with running_standin(context_length=CONTEXT, standin_seed=8) as url:
        theirs = httpx.post(
            f"{url}/generate",
            json={"text": "seeded", "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}},
        ).json()["text"]
    assert ours != theirs


def test_request_seed_changes_the_text(client):
    a = generate(client, "x", max_new_tokens=20, ignore_eos=True, sampling_seed=1)["text"]
    b = generate(client, "x", max_new_tokens=20, ignore_eos=True, sampling_seed=2)["text"]
    assert a != b


def test_max_new_tokens_gives_length_and_exact_count(client):
    out = generate(client, "long please", max_new_tokens=30, ignore_eos=True)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 30}
    assert meta["completion_tokens"] == 30 == count_tokens(out["text"]) == len(out["output_ids"])


def test_a_longer_budget_extends_the_same_text(client):
    short = generate(client, "prefix", max_new_tokens=5, ignore_eos=True)["text"]
    long = generate(client, "prefix", max_new_tokens=15, ignore_eos=True)["text"]
    assert long.startswith(short + " ")


def test_zero_new_tokens(client):
    out = generate(client, "nothing", max_new_tokens=0)
    assert out["text"] == "" and out["meta_info"]["completion_tokens"] == 0
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_natural_eos_finishes_with_stop():
    with running_standin(standin_natural_tokens="3:3") as url:
        out = httpx.post(
            f"{url}/generate", json={"text": "short", "sampling_params": {"max_new_tokens": 10}}
        ).json()
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_TOKEN_ID}
        assert out["meta_info"]["completion_tokens"] == 3 == count_tokens(out["text"])
        body = {"model": "m", "prompt": "short", "max_tokens": 10}
        choice = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
        assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", EOS_TOKEN_ID)


def test_stop_string_cuts_the_text_and_counts_the_tokens(client):
    full = generate(client, "stop me", max_new_tokens=20, ignore_eos=True)["text"]
    words = full.split(" ")
    stop = words[5][1:3]  # inside the sixth word
    expected = full[: full.index(stop)]
    out = generate(client, "stop me", max_new_tokens=20, ignore_eos=True, stop=[stop, "never-there"])
    assert out["text"] == expected
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}
    assert meta["completion_tokens"] == count_tokens(out["text"] + stop) == expected.count(" ") + 1


def test_stop_string_in_chat(client):
    full = chat(client, "chatty", max_tokens=20, ignore_eos=True).json()["choices"][0]["message"]["content"]
    stop = full.split(" ")[3]
    response = chat(client, "chatty", max_tokens=20, ignore_eos=True, stop=stop)
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == full[: full.index(stop)]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", stop)


def test_stop_token_ids(client):
    out = generate(client, "ids", max_new_tokens=20, ignore_eos=True)
    target = out["output_ids"][4]
    first = out["output_ids"].index(target)
    cut = generate(client, "ids", max_new_tokens=20, ignore_eos=True, stop_token_ids=[target])
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert cut["meta_info"]["completion_tokens"] == first + 1
    assert cut["text"] == " ".join(out["text"].split(" ")[:first])


def test_prompt_longer_than_context_is_400(client):
    prompt = " ".join(["word"] * CONTEXT)
    response = client.post("/generate", json={"text": prompt})
    assert response.status_code == 400
    message = f"The input ({CONTEXT} tokens) is longer than the model's context length ({CONTEXT} tokens)."
    assert response.json() == {"error": {"message": message}}
    response = chat(client, prompt)
    assert response.status_code == 400
    body = response.json()
    assert body["object"] == "error" and body["code"] == 400 and body["type"] == "BadRequestError"
    assert "longer than the model's context length" in body["message"]


def test_prompt_plus_max_tokens_over_context_is_400(client):
    response = client.post("/v1/completions", json={"model": "m", "prompt": "a b c", "max_tokens": CONTEXT})
    assert response.status_code == 400
    assert "maximum context length of 256 tokens" in response.json()["message"]


def test_chat_without_max_tokens_stops_within_context(client):
    body = chat(client, "open ended", ignore_eos=True).json()
    usage = body["usage"]
    assert usage["total_tokens"] < CONTEXT
    assert body["choices"][0]["finish_reason"] == "length"


def test_repeated_prompt_is_cached_until_flush(client):
    first = generate(client, "cache this prompt please", max_new_tokens=2)["meta_info"]
    second = generate(client, "cache this prompt please", max_new_tokens=2)["meta_info"]
    assert first["cached_tokens"] == 0
    assert second["cached_tokens"] == second["prompt_tokens"] - 1
    assert client.post("/flush_cache").status_code == 200
    assert generate(client, "cache this prompt please", max_new_tokens=2)["meta_info"]["cached_tokens"] == 0


class TestStreaming:
    def test_chat_stream_matches_the_plain_answer(self, client):
        plain = chat(client, "stream it", max_tokens=12).json()
        streamed = chat(
            client, "stream it", max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
        events = sse_events(streamed)
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] for e in events)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert text == plain["choices"][0]["message"]["content"]
        finals = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
        assert finals[-1] == plain["choices"][0]["finish_reason"] and set(finals[:-1]) == {None}
        assert events[-1]["choices"] == [] and events[-1]["usage"] == plain["usage"]
        assert len(events) >= 4  # role, at least one token per chunk, finish, usage

    def test_completion_stream(self, client):
        body = {"model": "m", "prompt": "stream me", "max_tokens": 9, "ignore_eos": True}
        plain = client.post("/v1/completions", json=body).json()
        events = sse_events(client.post("/v1/completions", json={**body, "stream": True}))
        assert len(events) == 10  # 9 tokens + the finish chunk; no usage unless asked
        assert "".join(e["choices"][0]["text"] for e in events) == plain["choices"][0]["text"]
        assert events[-1]["choices"][0]["finish_reason"] == "length"

    def test_generate_stream_is_cumulative(self, client):
        plain = generate(client, "native stream", max_new_tokens=6, ignore_eos=True)
        body = {
            "text": "native stream",
            "stream": True,
            "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
        }
        events = sse_events(client.post("/generate", json=body))
        assert events[-1]["text"] == plain["text"]
        assert events[-1]["output_ids"] == plain["output_ids"]
        assert events[-1]["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
        assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
        assert all(b["text"].startswith(a["text"]) for a, b in itertools.pairwise(events))
