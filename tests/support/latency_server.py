"""A stand-in SGLang API with a fixed latency per request, on N ports in one process.

    python tests/support/latency_server.py COUNT LATENCY_S [MODE]

Listens on COUNT free ports of 127.0.0.1, prints them as one JSON line, then serves
/health_generate, /model_info, /v1/models and /v1/loads (SGLang 0.5.12 shapes), each answer
after LATENCY_S seconds. ``GET /in_flight`` gives the number of those requests in flight now and at the
peak, across every port (``POST /in_flight/reset`` starts a new peak): probing N instances at once puts N
in flight together.

It also answers /v1/chat/completions. MODE says how it treats the first attempt at each distinct
body (later attempts get a completion): ``ok`` (default) answers it; ``error_object`` answers 200
with ``{"object": "error", ...}`` (what an OpenAI-compatible server sends from some error paths);
``retry_after`` answers 429 with ``Retry-After: 1``; ``empty_choice`` answers 200 with
``{"choices": [{}]}``; ``hostile`` answers every attempt with one of ``HOSTILE`` (200s whose body
is not a completion that can be stored: a usage count that is a string, a list, a bool, negative or
over 64 bits, choices of the wrong shape, fields of the wrong type, not JSON), in turn;
``hostile_once`` answers the first attempt at each body so, later ones with a completion.
``GET /attempts`` lists (monotonic time,
body digest) of every completion request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time

from aiohttp import web


def _answer(**changes: object) -> bytes:
    """A good chat completion with ``changes`` applied: ``{"usage.prompt_tokens": "abc"}`` sets a
    nested field, a value of ``...`` removes it."""
    body: dict = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25},
    }
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return json.dumps(body).encode()


_C0 = "choices.0"
HOSTILE: list[bytes] = [
    _answer(**{"usage.prompt_tokens": "abc"}),
    _answer(**{"usage.prompt_tokens": [1]}),
    _answer(**{"usage.completion_tokens": -5}),
    _answer(**{"usage.completion_tokens": True}),
    _answer(**{"usage.prompt_tokens": 1.5}),
    _answer(**{"usage.total_tokens": {"n": 1}}),
    _answer(usage="lots"),
    _answer(usage=[5, 20]),
    _answer(**{"usage.completion_tokens": 2**70}),  # orjson cannot write it back
    _answer(choices={"0": {}}),
    _answer(choices=[]),
    _answer(choices=["fine"]),
    _answer(choices=[None]),
    _answer(**{f"{_C0}.message": "fine"}),
    _answer(**{f"{_C0}.message.content": 5}),
    _answer(**{f"{_C0}.message.content": ["fine"]}),
    _answer(**{f"{_C0}.message.content": ...}),
    _answer(**{f"{_C0}.message.role": 3}),
    _answer(**{f"{_C0}.message.reasoning_content": {"thought": 1}}),
    _answer(**{f"{_C0}.finish_reason": 7}),
    _answer(id=["chatcmpl"]),
    b"[1, 2, 3]",
    b"null",
    b'{"choices": [{"message": {"content": "fine"}}], "usage": {"prompt_tokens": NaN}}',
    b'{"choices": [{"message": {"content": "\\ud800"}}]',  # torn
    b"\xff\xfe not UTF-8",
    b"",
]


class InFlight:
    """The slow requests being answered now, and the most at once, across every port of the process."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0


def make_app(
    latency: float, port_index: int, mode: str = "ok", in_flight: InFlight | None = None
) -> web.Application:
    attempts: list[tuple[float, str]] = []
    bodies: list[object] = []
    seen: set[str] = set()
    flight = in_flight or InFlight()

    async def slow(payload):
        flight.now += 1
        flight.peak = max(flight.peak, flight.now)
        try:
            await asyncio.sleep(latency)
        finally:
            flight.now -= 1
        return web.Response(status=200) if payload is None else web.json_response(payload)

    async def show_in_flight(_r):
        return web.json_response({"now": flight.now, "peak": flight.peak})

    async def reset_in_flight(_r):
        flight.peak = flight.now
        return web.json_response({"now": flight.now, "peak": flight.peak})

    async def health(_r):
        return await slow(None)

    async def model_info(_r):
        return await slow(
            {"model_path": "/models/latency", "tokenizer_path": "/models/latency", "is_generation": True}
        )

    async def models(_r):
        return await slow({"object": "list", "data": [{"id": "latency-model", "object": "model"}]})

    async def loads(_r):
        load = {"dp_rank": 0, "num_running_reqs": port_index, "num_waiting_reqs": 0, "token_usage": 0.5,
                "gen_throughput": 100.0}  # fmt: skip
        return await slow({"loads": [load], "dp_rank_count": 1})

    async def chat(request):
        raw = await request.read()
        key = hashlib.sha256(raw).hexdigest()[:16]
        attempts.append((time.monotonic(), key))
        await asyncio.sleep(latency)
        first = key not in seen
        seen.add(key)
        if first and mode == "error_object":
            return web.json_response(
                {"object": "error", "message": "injected error object", "type": "BadRequest", "code": 400}
            )
        if first and mode == "empty_choice":  # what a proxy in front of SGLang may pass on
            return web.json_response({"id": "chatcmpl-" + key, "object": "chat.completion", "choices": [{}]})
        if mode == "hostile" or (first and mode == "hostile_once"):
            bad = HOSTILE[(len(attempts) - 1) % len(HOSTILE)]
            return web.Response(status=200, body=bad, content_type="application/json")
        if first and mode == "retry_after":
            return web.json_response({"message": "slow down"}, status=429, headers={"Retry-After": "1"})
        body = json.loads(raw)
        bodies.append(body)
        text = "answer to " + str(body["messages"][-1]["content"])
        return web.json_response(
            {
                "id": "chatcmpl-" + key,
                "object": "chat.completion",
                "model": "latency-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": "thought " + key,
                        },
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25},
            }
        )

    async def list_attempts(_r):
        return web.json_response(attempts)

    async def list_bodies(_r):
        return web.json_response(bodies)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/attempts", list_attempts)
    app.router.add_get("/bodies", list_bodies)
    app.router.add_get("/in_flight", show_in_flight)
    app.router.add_post("/in_flight/reset", reset_in_flight)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/loads", loads)
    return app


async def main(count: int, latency: float, mode: str = "ok") -> None:
    ports = []
    in_flight = InFlight()
    for i in range(count):
        runner = web.AppRunner(make_app(latency, i, mode, in_flight), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:4]))
