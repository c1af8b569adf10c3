"""A stand-in SGLang API with a fixed latency per request, on N ports in one process.

    python tests/unit/latency_server.py COUNT LATENCY_S

Listens on COUNT free ports of 127.0.0.1, prints them as one JSON line, then serves
/health_generate, /model_info, /v1/models and /v1/loads (SGLang 0.5.12 shapes), each answer
after LATENCY_S seconds. Used to show that probing N instances costs about one round trip.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web


def make_app(latency: float, port_index: int) -> web.Application:
    async def slow(payload):
        await asyncio.sleep(latency)
        return web.Response(status=200) if payload is None else web.json_response(payload)

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

    app = web.Application()
    app.router.add_get("/health_generate", health)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/loads", loads)
    return app


async def main(count: int, latency: float) -> None:
    ports = []
    for i in range(count):
        runner = web.AppRunner(make_app(latency, i), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
