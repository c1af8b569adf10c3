"""The stand-in's settings: what `sglang.launch_server` flags and `--standin-*` flags set."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class StandinConfig:
    """Everything the server needs to know, parsed and validated (see ``cli.parse_config``)."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str | None = None
    api_key: str | None = None
    enable_metrics: bool = False
    attention_backend: str | None = None
    mem_fraction_static: float = 0.88
    max_running_requests: int | None = None
    context_length: int = 32768
    tp_size: int = 1
    log_level: str = "info"
    watchdog_timeout: float = 300.0
    decode_log_interval: int = 40  # server_args.py:496 (0.5.12)
    reasoning_parser: str | None = None  # SGLang's --reasoning-parser: reasoning_content split off
    # --standin-* knobs
    load_seconds: float = 0.0  # no listener yet: connections refused, as while SGLang loads the model
    warmup_seconds: float = 0.0  # listening, /health* 503 (ServerStatus.Starting)
    health_seconds: float = 1.0  # how long a /health_generate takes once up (SGLang: >= 1 s)
    drain_poll_seconds: float = 5.0  # SGLang's sigterm_watchdog polls every 5 s
    ttft_seconds: float = 0.0
    decode_tokens_per_second: float = 0.0  # 0: no decode time at all
    prefill_tokens_per_second: float = 0.0  # uncached prompt tokens/s, one prefill at a time; 0: free
    prefix_cache_tokens: int | None = None  # the prefix cache's budget; None: max_total_num_tokens
    error_rate: float = 0.0
    hang_rate: float = 0.0
    crash_after: int | None = None
    hang_after: int | None = None  # the forward loop stops after N forward batches (watchdog.py)
    seed: int = 0
    natural_tokens: tuple[int, int] = (16, 256)

    @property
    def model_name(self) -> str:
        """The name clients see in `/v1/models` and `model` fields."""
        return self.served_model_name or self.model_path

    @property
    def max_total_num_tokens(self) -> int:
        """KV pool size the stand-in pretends to have (drives `token_usage`)."""
        return max(self.context_length, int(self.mem_fraction_static * 1_000_000))

    @property
    def prefix_cache_budget(self) -> int:
        """Tokens the prefix cache may hold (SGLang's tree lives in the KV pool)."""
        return self.max_total_num_tokens if self.prefix_cache_tokens is None else self.prefix_cache_tokens

    def server_args(self) -> dict[str, Any]:
        """The SGLang-named server arguments, as `/server_info` reports them (no secrets)."""
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "host": self.host,
            "port": self.port,
            "served_model_name": self.model_name,
            "api_key": None,  # never echoed, unlike real SGLang
            "enable_metrics": self.enable_metrics,
            "attention_backend": self.attention_backend,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests,
            "context_length": self.context_length,
            "tp_size": self.tp_size,
            "dp_size": 1,
            "log_level": self.log_level,
            "watchdog_timeout": self.watchdog_timeout,
            "decode_log_interval": self.decode_log_interval,
            "reasoning_parser": self.reasoning_parser,
        }

    def server_args_repr(self) -> str:
        """What SGLang 0.5.12 logs at start: `ServerArgs(...)`, the dataclass repr, API key included
        (sglang/srt/entrypoints/engine.py:773 `logger.info(f"{server_args=}")`)."""
        fields = {**self.server_args(), "api_key": self.api_key}
        return "ServerArgs(" + ", ".join(f"{name}={value!r}" for name, value in fields.items()) + ")"

    def standin_args(self) -> dict[str, Any]:
        """The `--standin-*` knobs, reported under `standin` in `/server_info`."""
        return {
            "load_seconds": self.load_seconds,
            "warmup_seconds": self.warmup_seconds,
            "health_seconds": self.health_seconds,
            "drain_poll_seconds": self.drain_poll_seconds,
            "ttft_seconds": self.ttft_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
            "prefix_cache_tokens": self.prefix_cache_budget,
            "error_rate": self.error_rate,
            "hang_rate": self.hang_rate,
            "crash_after": self.crash_after,
            "hang_after": self.hang_after,
            "seed": self.seed,
            "natural_tokens": list(self.natural_tokens),
        }
