"""The stand-in's endpoints: shapes and status codes, against a real server process."""

from __future__ import annotations

import httpx
import pytest
from sglfleet_testing.standin.process import running_standin
from sglfleet_testing.standin.tokenizer import count_tokens

pytestmark = pytest.mark.timeout(60)

MODEL = "Qwen/Qwen3-8B"


@pytest.fixture(scope="module")
def client():
    flags = {
        "model_path": MODEL,
        "served_model_name": "qwen3",
        "context_length": 4096,
        "enable_metrics": True,
    }
    with running_standin(**flags) as base_url, httpx.Client(base_url=base_url, timeout=10) as http:
        yield http


def test_health_answers_200_with_an_empty_body(client):
    for path in ("/health", "/health_generate"):
        response = client.get(path)
        assert response.status_code == 200
        assert response.content == b""


def test_model_info_under_both_names(client):
    for path in ("/model_info", "/get_model_info"):
        info = client.get(path).json()
        assert info["model_path"] == MODEL
        assert info["tokenizer_path"] == MODEL
        assert info["is_generation"] is True


def test_server_info_reports_args_status_and_version(client):
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        assert info["model_path"] == MODEL
        assert info["served_model_name"] == "qwen3"
        assert info["context_length"] == 4096
        assert info["status"] == "ready"
        assert info["version"] == "0.5.12"
        assert info["max_total_num_tokens"] >= 4096


def test_v1_models_lists_the_served_name(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [("qwen3", "model", 4096)]


def test_v1_loads_shape(client):
    body = client.get("/v1/loads").json()
    assert body["dp_rank_count"] == 1
    (load,) = body["loads"]
    for key in ("num_running_reqs", "num_waiting_reqs", "token_usage", "gen_throughput"):
        assert isinstance(load[key], int | float)
    assert body["aggregate"]["total_reqs"] == load["num_running_reqs"] + load["num_waiting_reqs"]


def test_generate_single(client):
    response = client.post(
        "/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 12}}
    )
    assert response.status_code == 200
    out = response.json()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 5
    assert meta["completion_tokens"] == len(out["output_ids"]) == count_tokens(out["text"])
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["finish_reason"]["type"] != "length" or meta["completion_tokens"] == 12
    assert isinstance(meta["id"], str) and meta["e2e_latency"] >= 0


def test_generate_batch_answers_a_list_in_order(client):
    prompts = ["one", "two two", "three three three"]
    response = client.post("/generate", json={"text": prompts, "sampling_params": {"max_new_tokens": 4}})
    assert response.status_code == 200
    outs = response.json()
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [1, 2, 3]
    singles = [
        client.post("/generate", json={"text": p, "sampling_params": {"max_new_tokens": 4}}).json()
        for p in prompts
    ]
    assert [o["text"] for o in outs] == [s["text"] for s in singles]


def test_generate_batch_with_sampling_params_per_prompt(client):
    params = [{"max_new_tokens": 2, "ignore_eos": True}, {"max_new_tokens": 5, "ignore_eos": True}]
    response = client.put(
        "/generate", json={"text": ["x", "y"], "sampling_params": params, "rid": ["r1", "r2"]}
    )
    assert response.status_code == 200
    outs = response.json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 5]
    assert [o["meta_info"]["id"] for o in outs] == ["r1", "r2"]
    mismatched = client.post("/generate", json={"text": ["x", "y", "z"], "sampling_params": params})
    assert mismatched.status_code == 400
    assert "sampling_params" in mismatched.json()["error"]["message"]


def test_generate_with_input_ids(client):
    out = client.post(
        "/generate", json={"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 3}}
    ).json()
    assert out["meta_info"]["prompt_tokens"] == 4


def test_generate_without_input_is_400(client):
    response = client.post("/generate", json={"sampling_params": {"max_new_tokens": 3}})
    assert response.status_code == 400
    assert "text or input_ids" in response.json()["message"]


def test_chat_completions_shape(client):
    response = client.post(
        "/v1/chat/completions",
        json={"model": "qwen3", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 7},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["completion_tokens"] == count_tokens(choice["message"]["content"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choice["finish_reason"] in ("stop", "length")


def test_completions_shape_and_batch(client):
    body = client.post(
        "/v1/completions", json={"model": "qwen3", "prompt": ["a b", "c"], "max_tokens": 5}
    ).json()
    assert body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["completion_tokens"] == sum(count_tokens(c["text"]) for c in body["choices"])


def test_openai_endpoints_want_json_content_type(client):
    response = client.post("/v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 400
    body = response.json()
    assert body["object"] == "error" and body["code"] == 400 and "application/json" in body["message"]


def test_invalid_request_is_400_with_the_error_shape(client):
    response = client.post("/v1/chat/completions", json={"model": "qwen3", "messages": []})
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"object", "message", "type", "param", "code"}


def test_flush_cache(client):
    response = client.post("/flush_cache")
    assert response.status_code == 200
    assert response.text.startswith("Cache flushed.")


def test_metrics_prometheus_text(client):
    client.post(
        "/generate", json={"text": "count me", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:generation_tokens_total",
    ):
        assert f"\n{name}{{" in text, name
    line = next(x for x in text.splitlines() if x.startswith("sglang:generation_tokens_total{"))
    assert 'model_name="qwen3"' in line
    assert float(line.rsplit(" ", 1)[1]) >= 5


def test_unknown_path_is_404(client):
    assert client.get("/nope").status_code == 404


def test_metrics_absent_without_the_flag():
    with running_standin() as base_url:
        assert httpx.get(f"{base_url}/metrics").status_code == 404


@pytest.fixture(scope="module")
def keyed_url():
    with running_standin(api_key="s3cret", enable_metrics=True) as base_url:
        yield base_url


class TestApiKey:
    @pytest.mark.parametrize(
        "path", ["/model_info", "/server_info", "/v1/models", "/v1/loads", "/flush_cache"]
    )
    def test_get_endpoints_need_the_key(self, keyed_url, path):
        assert httpx.get(keyed_url + path).status_code == 401
        assert httpx.get(keyed_url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(keyed_url + path, headers={"Authorization": "Bearer s3cret"}).status_code == 200

    def test_generation_needs_the_key(self, keyed_url):
        body = {"model": "m", "prompt": "x", "max_tokens": 2}
        response = httpx.post(f"{keyed_url}/v1/completions", json=body)
        assert response.status_code == 401
        assert response.json() == {"error": "Unauthorized"}
        ok = httpx.post(f"{keyed_url}/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200

    @pytest.mark.parametrize("path", ["/health", "/health_generate", "/metrics"])
    def test_health_and_metrics_are_exempt(self, keyed_url, path):
        assert httpx.get(keyed_url + path).status_code == 200

    def test_server_info_does_not_echo_the_key(self, keyed_url):
        info = httpx.get(f"{keyed_url}/server_info", headers={"Authorization": "Bearer s3cret"})
        assert "s3cret" not in info.text


def test_reasoning_parser_answers_as_sglang_builds_a_thinking_models_message():
    """With --reasoning-parser the answer is split as SGLang's _build_chat_response does: the thinking
    in reasoning_content, the rest in content, an empty part as null (content null when max_tokens cut
    the model while it was still thinking); separate_reasoning false turns the split off."""
    with (
        running_standin(model_path=MODEL, reasoning_parser="qwen3") as base_url,
        httpx.Client(base_url=base_url, timeout=10) as http,
    ):

        def message(**body) -> dict:
            request = {"messages": [{"role": "user", "content": "think, then answer"}], **body}
            answer = http.post("/v1/chat/completions", json=request)
            assert answer.status_code == 200
            return answer.json()["choices"][0]["message"]

        whole = message(max_tokens=200)
        assert whole["reasoning_content"] and whole["content"]
        cut = message(max_tokens=1)
        assert cut["reasoning_content"] and cut["content"] is None
        plain = message(max_tokens=200, separate_reasoning=False)
        assert plain["reasoning_content"] is None
        assert plain["content"] == f"{whole['reasoning_content']} {whole['content']}"
