"""The fleet ledger: one JSON file on the target that says how far the fleet has come.

Every phase (host, provision, training_stop, toolchain, sglang, model, fleet, prompts, generate,
merge, training_resume) records its outcome here: a status (done, failed or pending), the time the
phase took that outcome, and a dict of evidence (what proves it: GPU count, ports
answering, rows written, ...).

Recording is idempotent: recording the outcome a phase already has (same status,
same evidence) changes nothing, not even the time, so a role that records its phase
as its last task reports ``changed=false`` on a re-run.  ``time`` therefore reads as
"since when the phase has had this outcome".

Writes are atomic (temporary file in the same directory, fsync, rename, fsync of the
directory) and serialised with an advisory lock next to the file, so a reader never
sees half a ledger and two writers never lose each other's phase.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sglfleet.atomicio import atomic_write
from sglfleet.fleet._defaults import DEFAULT_PATH

Phase = Literal[
    "host",
    "provision",
    "training_stop",
    "toolchain",
    "sglang",
    "model",
    "fleet",
    "router",  # optional: SGLang's router in front of the fleet (role sglang_router)
    "prompts",
    "generate",
    "merge",
    "training_resume",
]
Status = Literal["done", "failed", "pending"]

#: The phases in the order they run (the checklist's order).
PHASES: tuple[str, ...] = get_args(Phase)
#: Phases a fleet may go without: in the checklist only once recorded.
OPTIONAL_PHASES: frozenset[str] = frozenset({"router"})
STATUSES: tuple[str, ...] = get_args(Status)

SCHEMA_VERSION = 1


class LedgerError(Exception):
    """The ledger file cannot be read or written; the message names the file and what is wrong."""


class PhaseRecord(BaseModel):
    """One phase's outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Status
    time: datetime = Field(description="when the phase took this outcome (UTC)")
    evidence: dict[str, Any] = Field(default_factory=dict)

    @field_validator("time")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    @field_validator("evidence")
    @classmethod
    def _json_evidence(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _json_roundtrip(value, "evidence")

    def same_outcome(self, status: str, evidence: dict[str, Any]) -> bool:
        """True when `status` and `evidence` are this record's (the time is not compared)."""
        return self.status == status and self.evidence == _json_roundtrip(evidence, "evidence")


class Ledger(BaseModel):
    """The whole file: a schema version and one record per phase that has recorded anything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = SCHEMA_VERSION
    phases: dict[Phase, PhaseRecord] = Field(default_factory=dict)

    def checklist(self) -> list[ChecklistRow]:
        """Every phase in run order; a phase that never recorded anything is pending, with no time
        (an optional one is left out until it records)."""
        rows = []
        for phase in PHASES:
            record = self.phases.get(phase)  # type: ignore[call-overload]
            if record is None:
                if phase in OPTIONAL_PHASES:
                    continue
                rows.append(
                    ChecklistRow(phase=phase, status="pending", time=None, evidence={}, recorded=False)
                )
            else:
                rows.append(
                    ChecklistRow(
                        phase=phase,
                        status=record.status,
                        time=record.time,
                        evidence=record.evidence,
                        recorded=True,
                    )
                )
        return rows

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


class ChecklistRow(BaseModel):
    """One line of the phase checklist `sglfleet status` prints."""

    model_config = ConfigDict(frozen=True)

    phase: Phase
    status: Status
    time: datetime | None
    evidence: dict[str, Any]
    recorded: bool


class RecordResult(BaseModel):
    """What `record_phase` / `remove_phase` did (or, in check mode, would do)."""

    model_config = ConfigDict(frozen=True)

    changed: bool
    path: str
    phase: Phase
    before: PhaseRecord | None
    after: PhaseRecord | None
    ledger: Ledger


def _json_roundtrip(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{what} must be JSON data (dicts, lists, strings, numbers, booleans, null): {exc}"
        ) from exc


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def load_ledger(path: str | os.PathLike[str] = DEFAULT_PATH) -> Ledger:
    """Read the ledger at `path`; a missing file is an empty ledger (every phase pending)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Ledger()
    except OSError as exc:
        raise LedgerError(f"{path}: cannot read the ledger: {exc.strerror or exc}") from exc
    return parse_ledger(text, source=str(path))


def parse_ledger(text: str, source: str = "<ledger>") -> Ledger:
    """Parse ledger JSON text; errors name `source`, the line, and the field."""
    if not text.strip():
        return Ledger()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    try:
        return Ledger.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise LedgerError(f"{source}: not a valid sglfleet ledger: {problems}") from exc


def write_ledger(path: str | os.PathLike[str], ledger: Ledger) -> None:
    """Write `ledger` to `path` atomically: temp file in the same directory, fsync, rename, fsync dir."""
    path = Path(path)
    try:
        with atomic_write(path, durable=True) as handle:
            handle.write(ledger.to_json().encode("utf-8"))
    except OSError as exc:
        raise LedgerError(f"{path}: cannot write the ledger: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def _locked(path: Path, *, create: bool) -> Iterator[None]:
    """Hold an exclusive advisory lock on `<path>.lock` (skipped when we may not create it)."""
    lock_path = path.with_name(path.name + ".lock")
    if not create and not lock_path.parent.is_dir():
        yield
        return
    try:
        lock_path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not create:  # check mode on a read-only place: reading without the lock is fine
            yield
            return
        raise LedgerError(f"{lock_path}: cannot open the ledger lock: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record_phase(
    path: str | os.PathLike[str],
    phase: str,
    status: str,
    evidence: dict[str, Any] | None = None,
    *,
    check_mode: bool = False,
    now: datetime | None = None,
) -> RecordResult:
    """Record `phase`'s outcome; unchanged (and untouched on disk) when it already has this outcome."""
    path = Path(path)
    evidence = {} if evidence is None else evidence
    _check_phase(phase)
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    with _locked(path, create=not check_mode):
        ledger = load_ledger(path)
        before = ledger.phases.get(phase)  # type: ignore[call-overload]
        if before is not None and before.same_outcome(status, evidence):
            return RecordResult(
                changed=False, path=str(path), phase=phase, before=before, after=before, ledger=ledger
            )
        after = PhaseRecord(status=status, time=now or _now(), evidence=evidence)  # type: ignore[arg-type]
        updated = Ledger(phases={**ledger.phases, phase: after})
        if not check_mode:
            write_ledger(path, updated)
    return RecordResult(changed=True, path=str(path), phase=phase, before=before, after=after, ledger=updated)


def remove_phase(path: str | os.PathLike[str], phase: str, *, check_mode: bool = False) -> RecordResult:
    """Forget `phase`'s record (it reads as pending again); unchanged when it has none."""
    path = Path(path)
    _check_phase(phase)
    with _locked(path, create=not check_mode and path.exists()):
        ledger = load_ledger(path)
        before = ledger.phases.get(phase)  # type: ignore[call-overload]
        if before is None:
            return RecordResult(
                changed=False, path=str(path), phase=phase, before=None, after=None, ledger=ledger
            )
        updated = Ledger(phases={k: v for k, v in ledger.phases.items() if k != phase})
        if not check_mode:
            write_ledger(path, updated)
    return RecordResult(changed=True, path=str(path), phase=phase, before=before, after=None, ledger=updated)


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
