"""A stand-in training job: "trains" until told to stop, then writes its checkpoint and exits.

It plays the part of the job the `training_stop` role must stop gracefully: on SIGTERM (or the
signal given with ``--checkpoint-signal``) it writes a checkpoint file (atomically: a temporary file
then a rename) and exits 0. With ``--ignore-sigterm`` it logs the signal and keeps going, so the
only way to stop it is SIGKILL (and then no checkpoint is written).

It resumes as a real trainer does after phase training_resume: ``--resume-from`` (or the environment
variable ``SGLFLEET_TRAIN_RESUME_FROM``, which the role's drop-in sets) names the checkpoint it continues
from (its step), and ``--dataset`` (or ``SGLFLEET_TRAIN_DATASET``) the training set, whose rows it counts
and logs: ``loaded 1234 rows from /path (sha256 ...)``, the line the role's verify step looks for.

With ``--torchrun`` it runs as torchrun does (torch 2.11.0): a parent (the launcher) and one rank, its
child in a session of its own. The parent turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into a stop
(torch/distributed/elastic/multiprocessing/api.py:76,546), sends that signal to the rank's process group
(agent/server/api.py:738-740 -> local_elastic_agent.py:408,416 -> multiprocessing/api.py:1007-1016 and
subprocess_handler.py:85 `os.killpg`), waits ``--launcher-kill-after`` seconds (30, `close`'s default
timeout, multiprocessing/api.py:649), SIGKILLs the rank if it is still there (:1026-1035), and exits 1
(the SignalException is re-raised, launcher/api.py:325-331). A rank whose checkpoint takes longer than
that is killed half-way, as under torchrun.

The module uses the standard library only, so it runs with any ``python3`` on a target without
the package installed: copy the file and run ``python3 trainer.py --checkpoint /path``.
``render_unit`` gives a systemd unit that runs it, for tests that stop a job by unit name.

    python -m sglfleet_testing.trainer --checkpoint /var/tmp/ckpt.json [--ignore-sigterm]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Trainer:
    """The training loop's state: which step it is on and whether it was asked to stop."""

    checkpoint: Path
    step_seconds: float = 0.1
    checkpoint_seconds: float = 0.0
    ignore_signal: bool = False
    step: int = 0
    stop_signal: int | None = None
    started: float = field(default_factory=time.time)

    def on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.ignore_signal:
            log(f"received {name} at step {self.step}: ignoring it (--ignore-sigterm)")
            return
        log(f"received {name} at step {self.step}: writing checkpoint")
        self.stop_signal = signum

    def resume(self, checkpoint: Path | None, dataset: Path | None) -> None:
        """Continue from `checkpoint`'s step and load `dataset` (count its rows), logging both."""
        if checkpoint is not None:
            try:
                self.step = int(json.loads(checkpoint.read_text())["step"])
                log(f"resumed from checkpoint {checkpoint} at step {self.step}")
            except FileNotFoundError:
                log(f"no checkpoint at {checkpoint}: starting at step 0")
        if dataset is not None:
            sha = hashlib.sha256()
            rows = 0
            with dataset.open("rb") as handle:
                for line in handle:
                    sha.update(line)
                    rows += bool(line.strip())
            log(f"loaded {rows} rows from {dataset} (sha256 {sha.hexdigest()})")

    def run(self) -> int:
        while self.stop_signal is None:
            time.sleep(self.step_seconds)
            self.step += 1
        time.sleep(self.checkpoint_seconds)  # a real checkpoint takes a while to write
        write_checkpoint(self.checkpoint, self.checkpoint_payload())
        log(f"checkpoint written to {self.checkpoint}; exiting")
        return 0

    def checkpoint_payload(self) -> dict[str, object]:
        return {
            "step": self.step,
            "signal": signal.Signals(self.stop_signal).name if self.stop_signal else None,
            "pid": os.getpid(),
            "started": self.started,
            "written": time.time(),
        }


def write_checkpoint(path: Path, payload: dict[str, object]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically, so a reader never sees half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True) + "\n")
    os.replace(tmp, path)


def render_unit(
    *,
    script: str,
    checkpoint: str,
    python: str = "/usr/bin/python3",
    description: str = "sglfleet stand-in training job",
    restart: str = "on-failure",
    extra_args: Sequence[str] = (),
) -> str:
    """A systemd service unit running this trainer (``script`` is where this file was copied to)."""
    args = " ".join([python, "-u", script, "--checkpoint", checkpoint, *extra_args])
    return (
        "[Unit]\n"
        f"Description={description}\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={args}\n"
        f"Restart={restart}\n"
        "RestartSec=1\n"
        # Long enough that systemd itself never kills it during a test: the role must.
        "TimeoutStopSec=300\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def log(message: str) -> None:
    print(f"trainer[{os.getpid()}]: {message}", flush=True)


#: The signals torchrun's agent turns into a stop (TORCHELASTIC_SIGNALS_TO_HANDLE's default,
#: multiprocessing/api.py:538-546).
LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: torchrun's wait between forwarding the signal and SIGKILL (multiprocessing/api.py:649 `timeout: int = 30`).
TORCHRUN_KILL_AFTER_S = 30.0


def run_launcher(rank_argv: Sequence[str], kill_after: float, poll: float = 0.05) -> int:
    """Be torchrun for one rank: start it in its own session, forward a stop signal to its process group,
    SIGKILL it `kill_after` seconds later if it is still there; exit 1 after a signal, else its status."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    for signum in LAUNCHER_SIGNALS:
        signal.signal(signum, on_signal)
    rank = subprocess.Popen(
        [sys.executable, "-u", os.path.abspath(__file__), *rank_argv], start_new_session=True
    )
    launcher = f"launcher[{os.getpid()}]"
    print(f"{launcher}: started rank 0 (pid {rank.pid})", flush=True)
    while not received:
        try:
            code = rank.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            continue
        print(f"{launcher}: rank 0 exited with {code}", flush=True)
        return 0 if code == 0 else 1
    name = signal.Signals(received[0]).name
    print(f"{launcher}: received {name}: sending {name} to rank 0, SIGKILL in {kill_after:g} s", flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(rank.pid, received[0])
    try:
        code = rank.wait(timeout=kill_after)
        print(f"{launcher}: rank 0 exited with {code}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"{launcher}: rank 0 still running after {kill_after:g} s: SIGKILL", flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglfleet_testing.trainer",
        description="A stand-in training job that writes a checkpoint when asked to stop.",
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint file written on stop")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="time one training step takes")
    parser.add_argument(
        "--checkpoint-seconds", type=float, default=0.0, help="time writing the checkpoint takes"
    )
    parser.add_argument(
        "--checkpoint-signal",
        default="SIGTERM",
        help="signal that makes it checkpoint and exit (default SIGTERM; SIGINT is always one too)",
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        default=os.environ.get("SGLFLEET_TRAIN_DATASET") or None,
        help="training set to load (default $SGLFLEET_TRAIN_DATASET): its rows are counted and logged",
    )
    parser.add_argument(
        "--resume-from",
        type=Path,
        default=os.environ.get("SGLFLEET_TRAIN_RESUME_FROM") or None,
        help="checkpoint to continue from (default $SGLFLEET_TRAIN_RESUME_FROM)",
    )
    parser.add_argument(
        "--torchrun",
        action="store_true",
        help="run as torchrun does: a launcher parent and one rank; the parent forwards the stop signal and "
        "SIGKILLs the rank --launcher-kill-after seconds later",
    )
    parser.add_argument(
        "--launcher-kill-after",
        type=float,
        default=TORCHRUN_KILL_AFTER_S,
        help=f"with --torchrun: seconds from forwarding the signal to SIGKILL ({TORCHRUN_KILL_AFTER_S:g})",
    )
    parser.add_argument(
        "--ignore-sigterm",
        action="store_true",
        help="log the stop signal and keep training: only SIGKILL stops it, and no checkpoint is written",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.torchrun:
        if args.launcher_kill_after < 0:
            print("--launcher-kill-after: must be 0 or more seconds", file=sys.stderr)
            return 2
        rank_argv = [a for a in argv if a != "--torchrun"]
        return run_launcher(rank_argv, args.launcher_kill_after)
    try:
        stop = signal.Signals[args.checkpoint_signal.upper()]
    except KeyError:
        print(f"--checkpoint-signal: unknown signal {args.checkpoint_signal!r}", file=sys.stderr)
        return 2
    trainer = Trainer(
        checkpoint=args.checkpoint,
        step_seconds=args.step_seconds,
        checkpoint_seconds=args.checkpoint_seconds,
        ignore_signal=args.ignore_sigterm,
    )
    for signum in {stop, signal.SIGINT}:
        signal.signal(signum, trainer.on_signal)
    try:
        trainer.resume(args.resume_from, args.dataset)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot resume: {exc}", file=sys.stderr)
        return 1
    log(f"training (checkpoint {args.checkpoint}, stops on {stop.name})")
    return trainer.run()


if __name__ == "__main__":
    sys.exit(main())
