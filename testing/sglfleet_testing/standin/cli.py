"""Argument parsing: the `sglang.launch_server` flags the project passes, plus `--standin-*`.

Anything else, or a value out of range, exits 2 with argparse's usage message, as
`sglang.launch_server` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from sglfleet_testing.standin.config import StandinConfig

# The attention backends SGLang 0.5.12 accepts for --attention-backend (ATTENTION_BACKEND_CHOICES,
# python/sglang/srt/server_args.py line 147; "compressed" is its deprecated alias of "dsv4").
ATTENTION_BACKENDS = (
    "aiter",
    "ascend",
    "compressed",
    "cutlass_mla",
    "dsv4",
    "dual_chunk_flash_attn",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "flex_attention",
    "intel_amx",
    "intel_xpu",
    "nsa",
    "tokenspeed_mla",
    "torch_native",
    "triton",
    "trtllm_mha",
    "trtllm_mla",
    "wave",
)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _number(
    kind: Callable[[str], Any], low: float | None, high: float | None, *, open_low: bool = False
) -> Callable[[str], Any]:
    """An argparse `type` that parses with `kind` and checks low <= x <= high (low < x if open_low)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if low is not None and (value <= low if open_low else value < low):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if open_low else '>='} {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} must be <= {high}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _token_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX token counts, got {text!r}") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return pair


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglfleet_testing.standin",
        description="SGLang 0.5.12 stand-in: the same HTTP API and flags, deterministic output, no GPU.",
        allow_abbrev=False,
    )
    sg = parser.add_argument_group("sglang.launch_server flags")
    sg.add_argument("--model-path", required=True, help="model name or path (reported, never loaded)")
    sg.add_argument("--host", default="127.0.0.1")
    sg.add_argument("--port", type=_number(int, 0, 65535), default=30000)
    sg.add_argument("--served-model-name", default=None, help="name in /v1/models (default: model path)")
    sg.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (not /health*, /metrics*)"
    )
    sg.add_argument("--enable-metrics", action="store_true", help="serve Prometheus text on /metrics")
    sg.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=None)
    sg.add_argument("--mem-fraction-static", type=_number(float, 0.0, 1.0, open_low=True), default=0.88)
    sg.add_argument("--max-running-requests", type=_number(int, 1, None), default=None)
    sg.add_argument("--context-length", type=_number(int, 2, None), default=32768)
    sg.add_argument("--tp-size", "--tp", dest="tp_size", type=_number(int, 1, None), default=1)
    sg.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    sg.add_argument("--watchdog-timeout", type=_number(float, 0.0, None, open_low=True), default=300.0)
    sg.add_argument(
        "--decode-log-interval",
        type=_number(int, 1, None),
        default=40,
        help="decode batches between two decode logs; each resets sglang:cache_hit_rate (server_args.py:496)",
    )
    sg.add_argument(
        "--reasoning-parser",
        default=None,
        help="answer chat requests as a thinking model does: the first half of the text as "
        "message.reasoning_content, the rest as message.content (null when nothing is left)",
    )

    st = parser.add_argument_group("stand-in knobs")
    st.add_argument(
        "--standin-load-seconds",
        type=_number(float, 0.0, None),
        default=0.0,
        help="seconds of 'model loading' before the server listens (connections refused meanwhile)",
    )
    st.add_argument(
        "--standin-warmup-seconds",
        type=_number(float, 0.0, None),
        default=0.0,
        help="/health and /health_generate answer 503 for this long after the server listens",
    )
    st.add_argument(
        "--standin-health-seconds",
        type=_number(float, 0.0, None),
        default=1.0,
        help="how long /health_generate takes once up (SGLang 0.5.12: its 1-token check, >= 1 s)",
    )
    st.add_argument(
        "--standin-drain-poll-seconds",
        type=_number(float, 0.0, None, open_low=True),
        default=5.0,
        help="after SIGTERM, how often the drain checks for requests left (SGLang 0.5.12: 5 s)",
    )
    st.add_argument(
        "--standin-ttft",
        type=_number(float, 0.0, None),
        default=0.0,
        help="time to first token, seconds",
    )
    st.add_argument(
        "--standin-decode-tps",
        type=_number(float, 0.0, None),
        default=0.0,
        help="decode tokens per second per request (0: decoding takes no time)",
    )
    st.add_argument(
        "--standin-prefill-tps",
        type=_number(float, 0.0, None),
        default=0.0,
        help="prefill tokens per second of the instance, one prefill at a time; cached prefix "
        "tokens are free (0: prefill takes no time)",
    )
    st.add_argument(
        "--standin-prefix-cache-tokens",
        type=_number(int, 0, None),
        default=None,
        metavar="N",
        help="token budget of the prefix cache, least recently used evicted first "
        "(default: the KV pool, max_total_num_tokens; 0: no cache, as --disable-radix-cache)",
    )
    st.add_argument(
        "--standin-error-rate",
        type=_number(float, 0.0, 1.0),
        default=0.0,
        help="fraction of generation requests answered 500",
    )
    st.add_argument(
        "--standin-hang-rate",
        type=_number(float, 0.0, 1.0),
        default=0.0,
        help="fraction of generation requests never answered",
    )
    st.add_argument(
        "--standin-crash-after",
        type=_number(int, 1, None),
        default=None,
        metavar="N",
        help="exit abruptly (os._exit) right after answering N generation requests",
    )
    st.add_argument(
        "--standin-hang-after",
        type=_number(int, 1, None),
        default=None,
        metavar="N",
        help="the forward loop stops after N forward batches (a hung GPU): requests never finish, HTTP "
        "still accepts; --watchdog-timeout later kills the server as SGLang's watchdog does",
    )
    st.add_argument("--standin-seed", type=int, default=0, help="seed of the output text and the faults")
    st.add_argument(
        "--standin-natural-tokens",
        type=_token_range,
        default=(16, 256),
        metavar="MIN:MAX",
        help="range of completion lengths at which the model emits EOS (default 16:256)",
    )
    return parser


def parse_config(argv: Sequence[str] | None = None) -> StandinConfig:
    """Parse the command line into a config; bad flags exit 2 (argparse)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.standin_error_rate + args.standin_hang_rate > 1.0:
        parser.error("--standin-error-rate plus --standin-hang-rate must not exceed 1")
    return StandinConfig(
        model_path=args.model_path,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        enable_metrics=args.enable_metrics,
        attention_backend=args.attention_backend,
        mem_fraction_static=args.mem_fraction_static,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        tp_size=args.tp_size,
        log_level=args.log_level,
        watchdog_timeout=args.watchdog_timeout,
        decode_log_interval=args.decode_log_interval,
        reasoning_parser=args.reasoning_parser,
        load_seconds=args.standin_load_seconds,
        warmup_seconds=args.standin_warmup_seconds,
        health_seconds=args.standin_health_seconds,
        drain_poll_seconds=args.standin_drain_poll_seconds,
        ttft_seconds=args.standin_ttft,
        decode_tokens_per_second=args.standin_decode_tps,
        prefill_tokens_per_second=args.standin_prefill_tps,
        prefix_cache_tokens=args.standin_prefix_cache_tokens,
        error_rate=args.standin_error_rate,
        hang_rate=args.standin_hang_rate,
        crash_after=args.standin_crash_after,
        hang_after=args.standin_hang_after,
        seed=args.standin_seed,
        natural_tokens=args.standin_natural_tokens,
    )
