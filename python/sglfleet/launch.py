"""Start an SGLang server with its API key off every command line and out of the log.

    python -m sglfleet.launch sglang.launch_server --model-path M --port P ...

The unit of each instance (role sglang_fleet) runs this as its ExecStart. The key comes from the
environment variable ``SGLANG_FLEET_API_KEY``, which systemd reads from the instance's 0600
EnvironmentFile; it is never a word of any command line:

- The launcher forks once. The child takes the key out of its environment (so that nothing SGLang
  starts inherits it), appends ``--api-key KEY`` to its in-memory ``sys.argv`` (``/proc/<pid>/cmdline``
  is the exec-time argv, which an in-process list never changes) and runs the server module in-process
  with :func:`runpy.run_module`, as ``python -m MODULE`` would. SGLang 0.5.12 parses that list:
  ``sglang/launch_server.py:66`` ``prepare_server_args(sys.argv[1:])``. Its scheduler and detokenizer
  are ``multiprocessing`` spawn children (``sglang/srt/entrypoints/engine.py:1305``), which get their
  arguments pickled through a pipe, not on their command line.
- SGLang logs every server argument, key included: ``engine.py:773`` ``logger.info(f"{server_args=}")``
  (``ServerArgs(... api_key='...', ...)``). A log-record factory replaces the key, and any
  ``api_key=``/``admin_api_key=`` value in a ``ServerArgs`` repr, before any handler sees the record.
  A factory, not a handler filter: SGLang replaces the root handlers twice with
  ``logging.basicConfig(force=True)`` (``server_args.py:7750-7755``, ``utils/common.py:1266``); the record
  factory survives that. The spawned children re-import this module as ``__mp_main__`` (the main
  module of the process), which installs the same factory there. They do see the key: the spawn pipe
  carries the parent's whole ``sys.argv``, ``--api-key KEY`` included (CPython 3.11
  ``multiprocessing/spawn.py:184`` ``get_preparation_data`` sends ``sys_argv=sys.argv``; ``prepare``
  sets it, :231-232, before it imports the main module, :243-244), so the factory there redacts that
  exact key (:func:`keys_in_argv`), not only the ``api_key=`` pattern.
- Stop semantics: on SIGTERM, SGLang 0.5.12 drains and then SIGKILLs itself
  (``managers/tokenizer_manager.py:2375-2411`` ``sigterm_watchdog`` ends in
  ``kill_process_tree(os.getpid(), include_parent=True)``, ``utils/common.py:1184-1186``
  ``itself.kill()``). systemd would record every normal stop as "failed (signal)". The parent stays
  as a small supervisor: it forwards SIGTERM/SIGINT/SIGHUP to the server and exits 0 when the server
  died by SIGKILL *after* a forwarded SIGTERM (the drain completed), but 137 when the server killed
  itself without being asked (SGLang does that too when a child dies: ``tokenizer_manager.py:2808-2817``
  ``running_phase_sigquit_handler``; and when a forward batch stalls longer than ``--watchdog-timeout``,
  whose scheduler watchdog SIGQUITs the main process, ``srt/utils/watchdog.py:149-163``), so that
  ``Restart=on-failure`` still restarts a crashed or hung instance.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import runpy
import signal
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from sglfleet.host import die_with_parent

__all__ = ["KEY_VARIABLE", "REDACTED", "keys_in_argv", "main", "protect_log", "redact"]

KEY_VARIABLE = "SGLANG_FLEET_API_KEY"
REDACTED = "<redacted>"
USAGE = f"usage: python -m sglfleet.launch MODULE [SERVER ARGS...]  (the API key from ${KEY_VARIABLE})"
# `api_key='...'` / `admin_api_key="..."` as a dataclass repr writes it (ServerArgs).
_ASSIGNMENT = re.compile(r"""(\b(?:admin_)?api_key\s*=\s*)(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# A server that killed itself without being asked to stop: what a shell reports for SIGKILL.
KILLED_UNASKED = 128 + signal.SIGKILL


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` with every secret, and every quoted `api_key=` value, replaced by REDACTED."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}'{REDACTED}'", text)


def protect_log(secrets: Sequence[str] = ()) -> None:
    """Make every log record of this process carry a redacted message (see the module docstring)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_sglfleet_redacting", False):
        return
    kept = tuple(s for s in secrets if s)

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it later, as it would have
            return record
        clean = redact(message, kept)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    factory._sglfleet_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


_KEY_FLAGS = ("--api-key", "--admin-api-key")


def keys_in_argv(argv: Sequence[str]) -> list[str]:
    """The values of --api-key / --admin-api-key (either spelling, `--flag V` or `--flag=V`) in `argv`."""
    keys = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in _KEY_FLAGS:
            if eq:
                keys.append(value)
            elif i + 1 < len(argv):
                keys.append(argv[i + 1])
    return [key for key in keys if key]


def _refuse_key_on_command_line(args: Sequence[str]) -> str | None:
    for arg in args:
        if arg in ("--api-key", "--admin-api-key") or arg.startswith(("--api-key=", "--admin-api-key=")):
            return (
                f"sglfleet.launch: refusing {arg.split('=')[0]} on the command line (it would be in "
                f"/proc/<pid>/cmdline and in `ps`): put the key in ${KEY_VARIABLE} (the instance's 0600 "
                "EnvironmentFile) instead"
            )
    return None


def _serve(module: str, args: list[str], environ: MutableMapping[str, str]) -> int:
    """The child: run `module` in-process with the key handed over in memory."""
    key = environ.pop(KEY_VARIABLE, "")
    protect_log([key])
    sys.argv = [module, *args, *(["--api-key", key] if key else [])]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(redact(str(code), [key]), file=sys.stderr)
        return 1
    return 0


def _supervise(child: int, on_signal: Callable[[int], None] | None = None) -> int:
    """The parent: forward stop signals to `child`, wait, map its end to this process's exit code."""
    asked_to_stop = False

    def forward(signum: int, _frame: Any) -> None:
        nonlocal asked_to_stop
        asked_to_stop = asked_to_stop or signum in (signal.SIGTERM, signal.SIGINT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)
        if on_signal is not None:
            on_signal(signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
            break
        except ChildProcessError:  # pragma: no cover (reaped elsewhere: nothing to report)
            return 1
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    signum = os.WTERMSIG(status)
    if asked_to_stop and signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        return 0  # the drain SGLang does on SIGTERM ends in SIGKILL to itself: a clean stop
    return 128 + signum


def main(argv: Sequence[str] | None = None, environ: MutableMapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    if not args or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    refusal = _refuse_key_on_command_line(args[1:])
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    # A stop signal that comes between the fork and the parent's handlers waits (blocked) for them.
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    parent = os.getpid()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's coverage is measured by the process tests)
        die_with_parent(parent)  # kill -9 of the launcher must not orphan a server holding the GPU
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        try:
            code = _serve(args[0], args[1:], environ)
        except BaseException:
            logging.getLogger("sglfleet.launch").exception("the server module failed")
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    environ.pop(KEY_VARIABLE, None)  # the parent has no use for it
    return _supervise(child)


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == "__mp_main__":
    # A multiprocessing spawn child of the server (see the module docstring): same log protection, with
    # the exact key the spawn pipe handed it in sys.argv.
    protect_log(keys_in_argv(sys.argv))
