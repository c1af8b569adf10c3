"""The HTTP API: SGLang 0.5.12's routes on aiohttp.web, backed by the stand-in engine."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from sglfleet_testing.standin import SGLANG_VERSION
from sglfleet_testing.standin.config import StandinConfig
from sglfleet_testing.standin.engine import ContextOverflow, Engine, Job, Result
from sglfleet_testing.standin.faults import Fault, FaultInjector
from sglfleet_testing.standin.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SamplingParams,
    generate_error,
    openai_error,
    validation_error,
)
from sglfleet_testing.standin.tokenizer import count_tokens, word_of

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 70
_DUMPS = json.dumps
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_DUMPS(data).encode(), status=status, content_type="application/json")


def _sse(data: Any) -> bytes:
    return b"data: " + _DUMPS(data).encode() + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class StandinApp:
    """The handlers and the little state they share (no globals: one instance per server)."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self.faults = FaultInjector(
            error_rate=config.error_rate,
            hang_rate=config.hang_rate,
            crash_after=config.crash_after,
            seed=config.seed,
        )
        self.ready_at = 0.0
        # SGLang's TokenizerManager.gracefully_exit (managers/tokenizer_manager.py:372): set by SIGTERM.
        self.gracefully_exit = False
        # SGLang's rid_to_state: the requests the drain waits for (tokenizer_manager.py:2381).
        self.in_flight: dict[str, None] = {}
        # Not SGLang's: the generation requests accepted after SIGTERM. SGLang takes them (only /health*
        # answer 503, http_server.py health_generate; tokenizer_manager.py:2375-2411 waits for them), so a
        # drain that left a router sending here shows up in this count (tests assert it is 0).
        self.accepted_while_draining = 0
        self._hung: set[asyncio.Task[Any]] = set()
        self._auth = config.api_key or None
        # ServerStatus.UnHealthy: a health check timed out (http_server.py:576); a SIGTERM then exits at
        # once, whatever is in flight (tokenizer_manager.py:2384-2391).
        self.unhealthy = False

    # -- plumbing ------------------------------------------------------------------------------

    def build(self) -> web.Application:
        middlewares = [self._require_api_key] if self._auth else []
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024**2)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        get, post = web.get, web.post
        routes = [
            get("/health", self.health),
            get("/health_generate", self.health),
            get("/model_info", self.model_info),
            get("/get_model_info", self.model_info),
            get("/server_info", self.server_info),
            get("/get_server_info", self.server_info),
            get("/v1/models", self.models),
            get("/v1/loads", self.loads),
            get("/get_load", self.get_load),
            post("/generate", self._generation(self.generate, openai=False)),
            web.put("/generate", self._generation(self.generate, openai=False)),
            post("/v1/chat/completions", self._generation(self.chat_completions)),
            post("/v1/completions", self._generation(self.completions)),
            get("/flush_cache", self.flush_cache),
            post("/flush_cache", self.flush_cache),
        ]
        if self.config.enable_metrics:
            routes.append(get("/metrics", self.metrics))
        app.add_routes(routes)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        # SGLang listens once the model is loaded, then sends itself a warm-up request; /health*
        # answer 503 until it is done (ServerStatus.Starting, http_server.py:519-520, 2017-2033).
        self.ready_at = time.monotonic() + self.config.warmup_seconds
        asyncio.get_running_loop().call_later(
            self.config.warmup_seconds, log.info, "The server is fired up and ready to roll!"
        )

    async def _on_shutdown(self, _app: web.Application) -> None:
        # SIGINT (uvicorn's own graceful shutdown): listening sockets are closed already;
        # in-flight requests are left to finish.
        for task in list(self._hung):
            task.cancel()

    # -- SIGTERM: SGLang 0.5.12's drain ----------------------------------------------------------

    def sigterm_handler(self) -> None:
        """SignalHandler.sigterm_handler (tokenizer_manager.py:2802-2806): only sets the flag; the
        server keeps listening and serving, /health* answer 503 from now on."""
        # registered with loop.add_signal_handler (tokenizer_manager.py:1635): called with no
        # arguments, so SGLang logs its defaults, signum=None frame=None
        log.warning("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.gracefully_exit = True

    async def sigterm_watchdog(self) -> None:
        """TokenizerManager.sigterm_watchdog (tokenizer_manager.py:2375-2411): poll the flag every
        5 s; then, every 5 s, exit once no request is left (new ones are still accepted and
        waited for); exit = SIGKILL of the process tree, itself included (utils/common.py:1184-1186)."""
        poll = self.config.drain_poll_seconds
        while not self.gracefully_exit:  # noqa: ASYNC110 (SGLang polls; the delay is part of its stop)
            await asyncio.sleep(poll)
        while True:
            remaining_rids = list(self.in_flight)
            if self.unhealthy:
                # tokenizer_manager.py:2384-2391: a failed health check means exit now, no drain.
                log.error("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true", "yes"):
                log.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            log.info(
                "Gracefully exiting... Remaining number of requests %d. "
                "Remaining requests remaining_rids=%r.",
                len(remaining_rids),
                remaining_rids,
            )
            if not remaining_rids:
                break
            await asyncio.sleep(poll)
        log.warning("Requests accepted while draining: %d", self.accepted_while_draining)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    @web.middleware
    async def _require_api_key(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        path = request.path
        if (
            request.method == "OPTIONS"
            or path.startswith(("/health", "/metrics"))
            or self._bearer_ok(request.headers.get("Authorization"))
        ):
            return await handler(request)
        return _json({"error": "Unauthorized"}, 401)

    def _bearer_ok(self, header: str | None) -> bool:
        """utils/auth.py:103-112 (0.5.12) `_check_bearer_token`: split at the first space, the scheme
        compared case-insensitively (`parts[0].lower() != "bearer"`), the key in constant time."""
        if not header or self._auth is None:
            return False
        parts = header.split(" ", 1)
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return False
        return secrets.compare_digest(parts[1], self._auth)

    def _generation(self, handler: _Handler, *, openai: bool = True) -> _Handler:
        """Wrap a generation endpoint with the injected faults and the crash counter."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            if self.gracefully_exit:
                self.accepted_while_draining += 1
            fault = self.faults.draw()
            if fault is Fault.ERROR:
                message = "Internal server error (injected by --standin-error-rate)."
                body = (
                    openai_error(message, 500, "InternalServerError") if openai else generate_error(message)
                )
                response = _json(body, 500)
            elif fault is Fault.HANG:
                await self._hang()
                raise AssertionError("unreachable")  # pragma: no cover
            else:
                rid = uuid.uuid4().hex
                self.in_flight[rid] = None
                try:
                    response = await handler(request)
                finally:
                    del self.in_flight[rid]
            if self.faults.answered_one():
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()
                log.error(
                    "crashing on purpose after %d requests (--standin-crash-after)", self.faults.answered
                )
                logging.shutdown()
                os._exit(CRASH_EXIT_CODE)
            return response

        return wrapped

    async def _hang(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._hung.add(task)
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self._hung.discard(task)

    @staticmethod
    async def _body(request: web.Request, *, require_json: bool) -> Any:
        if require_json and request.content_type != "application/json":
            raise _BadRequest(
                validation_error("Unsupported Media Type: Only 'application/json' is allowed"),
            )
        try:
            return await request.json(loads=json.loads)
        except ValueError as error:
            raise _BadRequest(validation_error(f"JSON decode error: {error}")) from None

    # -- native endpoints ----------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        """SGLang 0.5.12's health_generate (http_server.py:506-577), also behind /health: 503 while
        draining or starting; otherwise a 1-token generation, 200 once the engine answered. SGLang
        sleeps 1 s before its first look (`await asyncio.sleep(1)`, :558): --standin-health-seconds."""
        if self.gracefully_exit:
            log.info("Health check request received during shutdown. Returning 503.")
            return web.Response(status=503)
        if time.monotonic() < self.ready_at:
            return web.Response(status=503)
        if self.engine.hung:
            # The 1-token generation never comes back (the forward loop stopped): SGLang gives up after
            # SGLANG_HEALTH_CHECK_TIMEOUT (20 s) and answers 503 (http_server.py health_generate).
            await asyncio.sleep(float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
            self.unhealthy = True  # http_server.py:576 server_status = ServerStatus.UnHealthy
            return web.Response(status=503)
        if self.config.health_seconds:
            await asyncio.sleep(self.config.health_seconds)
        return web.Response(status=200)

    async def model_info(self, _request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "standin",
                "architectures": ["StandinForCausalLM"],
            }
        )

    def _load(self) -> dict[str, Any]:
        engine = self.engine
        stats, scheduler, config = engine.stats, engine.scheduler, self.config
        return {
            "dp_rank": 0,
            "num_running_reqs": scheduler.running,
            "num_waiting_reqs": scheduler.waiting,
            "num_used_tokens": stats.used_tokens,
            # used tokens plus the waiting requests' prompts (scheduler_metrics_mixin.py:1010-1012)
            "num_total_tokens": stats.used_tokens + stats.waiting_tokens,
            "max_total_num_tokens": config.max_total_num_tokens,
            "token_usage": round(stats.used_tokens / config.max_total_num_tokens, 4),
            "gen_throughput": round(stats.gen_throughput(), 2),
            "cache_hit_rate": round(stats.cache_hit_rate(), 4),
            "utilization": (
                round(scheduler.running / config.max_running_requests, 4)
                if config.max_running_requests
                else 0.0
            ),
            "max_running_requests": config.max_running_requests or 0,
        }

    async def server_info(self, _request: web.Request) -> web.Response:
        load = self._load()
        starting = time.monotonic() < self.ready_at
        return _json(
            {
                **self.config.server_args(),
                "status": "starting" if starting else ("shutting_down" if self.gracefully_exit else "ready"),
                "max_total_num_tokens": self.config.max_total_num_tokens,
                "max_req_input_len": self.config.context_length - 1,
                "internal_states": [
                    {
                        "num_running_reqs": load["num_running_reqs"],
                        "num_waiting_reqs": load["num_waiting_reqs"],
                        "token_usage": load["token_usage"],
                        "last_gen_throughput": load["gen_throughput"],
                    }
                ],
                "version": SGLANG_VERSION,
                "standin": {
                    **self.config.standin_args(),
                    "accepted_while_draining": self.accepted_while_draining,
                },
            }
        )

    async def models(self, _request: web.Request) -> web.Response:
        name = self.config.model_name
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": self.config.context_length,
                    }
                ],
            }
        )

    async def get_load(self, _request: web.Request) -> web.Response:
        """The deprecated /get_load (http_server.py:647-670, 0.5.12), which sglang-router's
        power_of_two policy reads: /v1/loads' core fields in the historical shape, one entry per rank."""
        log.warning(
            "Endpoint '/get_load' is deprecated and will be removed in a future version. "
            "Please use '/v1/loads' instead."
        )
        load = self._load()
        return _json(
            [
                {
                    "dp_rank": load["dp_rank"],
                    "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                    "num_waiting_reqs": load["num_waiting_reqs"],
                    "num_tokens": load["num_total_tokens"],
                    "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    async def loads(self, _request: web.Request) -> web.Response:
        load = self._load()
        load["num_total_reqs"] = load["num_running_reqs"] + load["num_waiting_reqs"]
        return _json(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "dp_rank_count": 1,
                "loads": [load],
                # entrypoints/v1_loads.py:62-88 `_compute_aggregate` (0.5.12), over the one rank
                "aggregate": {
                    "total_running_reqs": load["num_running_reqs"],
                    "total_waiting_reqs": load["num_waiting_reqs"],
                    "total_reqs": load["num_total_reqs"],
                    "total_used_tokens": load["num_used_tokens"],
                    "total_tokens": load["num_total_tokens"],
                    "avg_token_usage": load["token_usage"],
                    "avg_throughput": load["gen_throughput"],
                    "avg_utilization": load["utilization"],
                },
            }
        )

    async def flush_cache(self, _request: web.Request) -> web.Response:
        done = self.engine.flush_cache()
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
            status=200 if done else 400,
        )

    async def metrics(self, _request: web.Request) -> web.Response:
        assert self.engine.metrics is not None
        return web.Response(
            body=self.engine.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # -- generation ----------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request, require_json=False)
            req = GenerateRequest.model_validate(body)
        except _BadRequest as error:
            return _json(error.body, 400)
        except ValidationError as error:
            return _json(validation_error(str(error)), 400)
        try:
            jobs, rids = self._generate_jobs(req)
        except ValueError as error:  # ContextOverflow among others
            return _json(generate_error(str(error)), 400)
        if req.stream:
            if req.is_batch:
                return _json(generate_error("The stand-in streams single requests only."), 400)
            return await self._stream_generate(request, jobs[0], rids[0])
        if not req.is_batch:
            return _json(self._generate_output(await self.engine.generate(jobs[0]), rids[0]))
        results = await asyncio.gather(*(self.engine.generate(job) for job in jobs))
        return _json([self._generate_output(result, rid) for result, rid in zip(results, rids, strict=True)])

    def _generate_jobs(self, req: GenerateRequest) -> tuple[list[Job], list[str]]:
        if req.text is not None:
            texts = req.text if isinstance(req.text, list) else [req.text]
            prompts = [(text, count_tokens(text)) for text in texts]
        else:
            assert req.input_ids is not None
            batch: list[list[int]] = req.input_ids if req.is_batch else [req.input_ids]  # type: ignore[list-item]
            prompts = [(" ".join(word_of(i) for i in ids), len(ids)) for ids in batch]
        params = req.sampling_params
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError("The number of sampling_params must match the number of prompts.")
            per_prompt = params
        else:
            per_prompt = [params or SamplingParams()] * len(prompts)
        rids = req.rid if isinstance(req.rid, list) else [req.rid or uuid.uuid4().hex]
        if len(rids) != len(prompts):
            rids = [uuid.uuid4().hex for _ in prompts]
        jobs = [
            self.engine.job(
                prompt,
                tokens,
                sp.max_new_tokens,
                stop=sp.stops,
                stop_token_ids=sp.stop_token_ids or (),
                ignore_eos=sp.ignore_eos,
                seed=sp.sampling_seed,
            )
            for (prompt, tokens), sp in zip(prompts, per_prompt, strict=True)
        ]
        return jobs, rids

    @staticmethod
    def _meta(rid: str, result: Result | None, completion_tokens: int, prompt_tokens: int, elapsed: float):
        return {
            "id": rid,
            "finish_reason": result.completion.finish_reason if result else None,
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": completion_tokens,
            "cached_tokens": result.cached_tokens if result else 0,
            "e2e_latency": elapsed,
        }

    def _generate_output(self, result: Result, rid: str) -> dict[str, Any]:
        completion = result.completion
        return {
            "text": completion.text,
            "output_ids": completion.output_ids,
            "meta_info": self._meta(
                rid, result, completion.completion_tokens, result.prompt_tokens, result.e2e_latency
            ),
        }

    async def _stream_generate(self, request: web.Request, job: Job, rid: str) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        start = time.perf_counter()
        text, ids = "", []
        async for chunk in self.engine.stream(job):
            text += chunk.delta
            ids += chunk.token_ids
            meta = self._meta(rid, chunk.result, len(ids), job.prompt_tokens, time.perf_counter() - start)
            await response.write(_sse({"text": text, "output_ids": list(ids), "meta_info": meta}))
        await response.write(_DONE)
        return response

    # -- OpenAI-compatible ---------------------------------------------------------------------

    async def _openai_request(self, request: web.Request, model: type[Any]) -> Any:
        body = await self._body(request, require_json=True)
        try:
            return model.model_validate(body)
        except ValidationError as error:
            raise _BadRequest(validation_error(str(error))) from None

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            req: ChatCompletionRequest = await self._openai_request(request, ChatCompletionRequest)
            prompt = req.render()
            job = self.engine.job(
                prompt,
                count_tokens(prompt),
                req.limit,
                stop=req.stops,
                stop_token_ids=req.stop_token_ids or (),
                ignore_eos=req.ignore_eos,
                seed=req.seed,
            )
        except _BadRequest as error:
            return _json(error.body, 400)
        except ContextOverflow as error:
            return _json(openai_error(str(error)), 400)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            return await self._stream_chat(request, req, job, rid, created)
        result = await self.engine.generate(job)
        completion = result.completion
        reasoning, content = self._split_reasoning(completion.text, req)
        return _json(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": req.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "reasoning_content": reasoning,
                            "tool_calls": None,
                        },
                        "logprobs": None,
                        "finish_reason": completion.finish_type,
                        "matched_stop": completion.matched,
                    }
                ],
                "usage": self._usage(result.prompt_tokens, completion.completion_tokens),
                "metadata": {"weight_version": "default"},
            }
        )

    def _split_reasoning(self, text: str, req: ChatCompletionRequest) -> tuple[str | None, str | None]:
        """(reasoning_content, content) of an answer. With --reasoning-parser (and the request's
        separate_reasoning, default true) the model "thinks" for the first half of its words; what is
        left is the answer. SGLang 0.5.12 builds the message the same way, an empty part as null
        (sglang/srt/entrypoints/openai/serving_chat.py, _build_chat_response: ``content=text if text
        else None``, ``reasoning_content=reasoning_text if reasoning_text else None``): an answer cut
        by max_tokens while still thinking has ``content: null``."""
        if not self.config.reasoning_parser or not req.separate_reasoning:
            return None, text
        words = text.split(" ") if text else []
        cut = (len(words) + 1) // 2
        return " ".join(words[:cut]) or None, " ".join(words[cut:]) or None

    async def _stream_chat(
        self, request: web.Request, req: ChatCompletionRequest, job: Job, rid: str, created: int
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model}
        role = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        await response.write(_sse({**head, "choices": [role]}))
        async for chunk in self.engine.stream(job):
            if chunk.delta:
                choice = {
                    "index": 0,
                    "delta": {"content": chunk.delta},
                    "logprobs": None,
                    "finish_reason": None,
                }
                await response.write(_sse({**head, "choices": [choice]}))
            if chunk.result is not None:
                completion = chunk.result.completion
                final = {
                    "index": 0,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": completion.finish_type,
                    "matched_stop": completion.matched,
                }
                await response.write(_sse({**head, "choices": [final]}))
                if req.include_usage:
                    usage = self._usage(chunk.result.prompt_tokens, completion.completion_tokens)
                    await response.write(_sse({**head, "choices": [], "usage": usage}))
        await response.write(_DONE)
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            req: CompletionRequest = await self._openai_request(request, CompletionRequest)
            if isinstance(req.prompt, str):
                prompts = [(req.prompt, count_tokens(req.prompt))]
            elif isinstance(req.prompt[0], int):
                prompts = [(" ".join(word_of(i) for i in req.prompt), len(req.prompt))]  # type: ignore[arg-type]
            else:
                prompts = [(text, count_tokens(text)) for text in req.prompt]  # type: ignore[arg-type]
            jobs = [
                self.engine.job(
                    prompt,
                    tokens,
                    req.max_tokens,
                    stop=req.stops,
                    stop_token_ids=req.stop_token_ids or (),
                    ignore_eos=req.ignore_eos,
                    seed=req.seed,
                )
                for prompt, tokens in prompts
            ]
        except _BadRequest as error:
            return _json(error.body, 400)
        except ContextOverflow as error:
            return _json(openai_error(str(error)), 400)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if req.stream:
            if len(jobs) != 1:
                return _json(openai_error("The stand-in streams single prompts only."), 400)
            return await self._stream_completion(request, req, jobs[0], rid, created)
        if len(jobs) == 1:
            results = [await self.engine.generate(jobs[0])]
        else:
            results = list(await asyncio.gather(*(self.engine.generate(job) for job in jobs)))
        return _json(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": req.model,
                "choices": [
                    {
                        "index": index,
                        "text": result.completion.text,
                        "logprobs": None,
                        "finish_reason": result.completion.finish_type,
                        "matched_stop": result.completion.matched,
                    }
                    for index, result in enumerate(results)
                ],
                "usage": self._usage(
                    sum(r.prompt_tokens for r in results),
                    sum(r.completion.completion_tokens for r in results),
                ),
                "metadata": {"weight_version": "default"},
            }
        )

    async def _stream_completion(
        self, request: web.Request, req: CompletionRequest, job: Job, rid: str, created: int
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        head = {"id": rid, "object": "text_completion", "created": created, "model": req.model}
        async for chunk in self.engine.stream(job):
            if chunk.delta:
                choice = {"index": 0, "text": chunk.delta, "logprobs": None, "finish_reason": None}
                await response.write(_sse({**head, "choices": [choice]}))
            if chunk.result is not None:
                completion = chunk.result.completion
                final = {
                    "index": 0,
                    "text": "",
                    "logprobs": None,
                    "finish_reason": completion.finish_type,
                    "matched_stop": completion.matched,
                }
                await response.write(_sse({**head, "choices": [final]}))
                if req.include_usage:
                    usage = self._usage(chunk.result.prompt_tokens, completion.completion_tokens)
                    await response.write(_sse({**head, "choices": [], "usage": usage}))
        await response.write(_DONE)
        return response


class _BadRequest(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("message"))
        self.body = body
