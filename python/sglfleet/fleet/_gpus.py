"""GPU facts from `nvidia-smi`: the GPUs a host has, their memory, and the compute processes on them.

Two queries, both CSV without header or units:

    nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,compute_cap,driver_version \
        --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits

Fields nvidia-smi cannot fill read ``[N/A]`` (or ``[Not Supported]``, ``[Insufficient Permissions]``,
``[Unknown Error]``); they become ``None``.  A host without `nvidia-smi` has no GPUs: that is a fact,
not an error (`nvidia_smi_found` says which); callers that need GPUs check `gpu_count`.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ComputeProcess",
    "Gpu",
    "GpuFacts",
    "GpuQueryError",
    "combine",
    "find_nvidia_smi",
    "parse_compute_apps",
    "parse_gpus",
    "query",
    "query_tolerant",
]

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "compute_cap", "driver_version")
APP_FIELDS = ("pid", "gpu_uuid", "used_memory", "process_name")
GPU_QUERY = ("--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits")
APP_QUERY = ("--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits")

#: What nvidia-smi prints where it has no value.
_MISSING = {"[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]", ""}
#: nvidia-smi's own words for "this host has no GPU" (exit code 6 too).
_NO_DEVICES = "No devices were found"
_NO_PROCESSES = "No running processes found"


class GpuQueryError(Exception):
    """nvidia-smi ran but its answer cannot be used; the message says which command and why."""


class ComputeProcess(BaseModel):
    """A process holding a GPU context (what `--query-compute-apps` lists)."""

    model_config = ConfigDict(frozen=True)

    pid: int
    gpu_uuid: str
    gpu_index: int | None = None
    used_memory_mib: int | None
    process_name: str | None


class Gpu(BaseModel):
    """One GPU (a row of `--query-gpu`) and the compute processes on it."""

    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None
    compute_cap: str | None
    driver_version: str | None
    processes: tuple[ComputeProcess, ...] = ()

    @property
    def busy(self) -> bool:
        return bool(self.processes)

    @property
    def sm(self) -> str | None:
        """The compute capability as CUDA arch digits: ``12.0`` -> ``120`` (``sm_120``)."""
        return self.compute_cap.replace(".", "") if self.compute_cap else None


class GpuFacts(BaseModel):
    """Everything `gpu_facts` reports."""

    model_config = ConfigDict(frozen=True)

    nvidia_smi_found: bool
    nvidia_smi_path: str | None
    gpu_count: int
    gpus: tuple[Gpu, ...] = ()
    processes: tuple[ComputeProcess, ...] = ()
    driver_version: str | None = None
    busy_gpus: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        data = self.model_dump(mode="json")
        for gpu, raw in zip(self.gpus, data["gpus"], strict=True):
            raw["busy"] = gpu.busy
            raw["sm"] = gpu.sm
        return data


def _value(raw: str) -> str | None:
    raw = raw.strip()
    return None if raw in _MISSING else raw


def _int(raw: str, what: str, line_no: int, line: str) -> int | None:
    value = _value(raw)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        raise GpuQueryError(f"line {line_no}: {what} is not a number: {raw.strip()!r} in {line!r}") from None


def _rows(text: str, fields: Sequence[str]) -> list[tuple[int, str, list[str]]]:
    rows = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or _NO_DEVICES in line or _NO_PROCESSES in line:
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if len(cells) != len(fields):
            expected = f"{len(fields)} fields ({','.join(fields)})"
            raise GpuQueryError(f"line {line_no}: expected {expected}, got {len(cells)}: {line!r}")
        rows.append((line_no, line, cells))
    return rows


def parse_gpus(text: str) -> list[Gpu]:
    """Parse `--query-gpu=index,uuid,name,memory.used,memory.total,compute_cap,driver_version` CSV."""
    gpus = []
    for line_no, line, cells in _rows(text, GPU_FIELDS):
        index = _int(cells[0], "index", line_no, line)
        uuid = _value(cells[1])
        if index is None or uuid is None:
            raise GpuQueryError(f"line {line_no}: a GPU without index or uuid: {line!r}")
        gpus.append(
            Gpu(
                index=index,
                uuid=uuid,
                name=_value(cells[2]) or "unknown",
                memory_used_mib=_int(cells[3], "memory.used", line_no, line),
                memory_total_mib=_int(cells[4], "memory.total", line_no, line),
                compute_cap=_value(cells[5]),
                driver_version=_value(cells[6]),
            )
        )
    return sorted(gpus, key=lambda g: g.index)


def parse_compute_apps(text: str) -> list[ComputeProcess]:
    """Parse `--query-compute-apps=pid,gpu_uuid,used_memory,process_name` CSV."""
    apps = []
    for line_no, line, cells in _rows(text, APP_FIELDS):
        pid = _int(cells[0], "pid", line_no, line)
        uuid = _value(cells[1])
        if pid is None or uuid is None:
            raise GpuQueryError(f"line {line_no}: a compute process without pid or gpu_uuid: {line!r}")
        apps.append(
            ComputeProcess(
                pid=pid,
                gpu_uuid=uuid,
                used_memory_mib=_int(cells[2], "used_memory", line_no, line),
                process_name=_value(cells[3]),
            )
        )
    return apps


def combine(gpus: Sequence[Gpu], apps: Sequence[ComputeProcess], nvidia_smi_path: str | None) -> GpuFacts:
    """Attach each compute process to its GPU (by uuid) and summarise."""
    index_of = {g.uuid: g.index for g in gpus}
    placed = [a.model_copy(update={"gpu_index": index_of.get(a.gpu_uuid)}) for a in apps]
    with_apps = [
        g.model_copy(update={"processes": tuple(a for a in placed if a.gpu_uuid == g.uuid)}) for g in gpus
    ]
    drivers = {g.driver_version for g in gpus if g.driver_version}
    return GpuFacts(
        nvidia_smi_found=nvidia_smi_path is not None,
        nvidia_smi_path=nvidia_smi_path,
        gpu_count=len(with_apps),
        gpus=tuple(with_apps),
        processes=tuple(placed),
        driver_version=drivers.pop() if len(drivers) == 1 else None,
        busy_gpus=tuple(g.index for g in with_apps if g.busy),
    )


Runner = Callable[[Sequence[str], float], tuple[int, str, str]]


def _run(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def find_nvidia_smi(nvidia_smi: str = "nvidia-smi") -> str | None:
    """The path of `nvidia_smi` (a name looked up in PATH, or a path); None when there is none."""
    if os.sep in nvidia_smi:
        return nvidia_smi if os.access(nvidia_smi, os.X_OK) else None
    return shutil.which(nvidia_smi)


def query(nvidia_smi: str = "nvidia-smi", *, timeout: float = 30.0, runner: Runner = _run) -> GpuFacts:
    """Run both nvidia-smi queries; no nvidia-smi -> no GPUs (`nvidia_smi_found=False`)."""
    path = find_nvidia_smi(nvidia_smi)
    if path is None:
        return GpuFacts(nvidia_smi_found=False, nvidia_smi_path=None, gpu_count=0)
    texts = []
    for args in (GPU_QUERY, APP_QUERY):
        argv = [path, *args]
        try:
            rc, out, err = runner(argv, timeout)
        except subprocess.TimeoutExpired:
            raise GpuQueryError(f"{' '.join(argv)}: no answer within {timeout:g} s") from None
        except OSError as exc:
            raise GpuQueryError(f"{' '.join(argv)}: cannot run: {exc.strerror or exc}") from None
        if _NO_DEVICES in out + err:
            return GpuFacts(nvidia_smi_found=True, nvidia_smi_path=path, gpu_count=0)
        if rc != 0:
            detail = (err.strip() or out.strip() or "no output").splitlines()[0]
            raise GpuQueryError(f"{' '.join(argv)}: exit code {rc}: {detail}")
        texts.append(out)
    try:
        gpus = parse_gpus(texts[0])
    except GpuQueryError as exc:
        raise GpuQueryError(f"{path} {GPU_QUERY[0]}: {exc}") from None
    try:
        apps = parse_compute_apps(texts[1])
    except GpuQueryError as exc:
        raise GpuQueryError(f"{path} {APP_QUERY[0]}: {exc}") from None
    return combine(gpus, apps, path)


def _tolerant_run(argv: list[str], parse: Callable[[str], list], timeout: float, runner: Runner):
    """(rows that parse, error messages, whether nvidia-smi says there is no device)."""
    try:
        rc, out, err = runner(argv, timeout)
    except subprocess.TimeoutExpired:
        return [], [f"{' '.join(argv)}: no answer within {timeout:g} s"], False
    except OSError as exc:
        return [], [f"{' '.join(argv)}: cannot run: {exc.strerror or exc}"], False
    if _NO_DEVICES in out + err:
        return [], [], True
    good, bad = [], []
    for line in out.splitlines():
        try:
            good += parse(line)
        except GpuQueryError:
            bad.append(line.strip())
    errors = bad + [line.strip() for line in err.splitlines() if line.strip()]
    if rc != 0 and not errors:
        errors.append(f"{' '.join(argv)}: exit code {rc}")
    return good, errors, False


def query_tolerant(
    nvidia_smi: str = "nvidia-smi",
    indices: Sequence[int] = (),
    *,
    timeout: float = 30.0,
    runner: Runner = _run,
) -> tuple[GpuFacts, list[str]]:
    """`query` for a status display: the GPUs that answer, and what nvidia-smi said about the others.

    A GPU that fell off the bus makes nvidia-smi print "Unable to determine the device handle for GPU
    0000:0B:00.0: Unknown Error" and exit non-zero, often instead of every GPU's row
    (NVIDIA/open-gpu-kernel-modules#387, meta-llama/llama-models#200), while ``nvidia-smi -i N`` still
    answers for a GPU that works and fails for the lost one (NVIDIA/nvidia-docker#1553). So the rows
    that parse are kept, and each GPU of `indices` that is not among them is asked alone with ``-i``;
    the error lines (and a failure to run at all) come back as messages instead of an exception.
    """
    path = find_nvidia_smi(nvidia_smi)
    if path is None:
        return GpuFacts(nvidia_smi_found=False, nvidia_smi_path=None, gpu_count=0), []
    gpus, errors, none = _tolerant_run([path, *GPU_QUERY], parse_gpus, timeout, runner)
    if none:
        return GpuFacts(nvidia_smi_found=True, nvidia_smi_path=path, gpu_count=0), []
    if errors:
        listed = {g.index for g in gpus}
        for index in sorted(set(indices) - listed):
            one, problems, _none = _tolerant_run(
                [path, "-i", str(index), *GPU_QUERY], parse_gpus, timeout, runner
            )
            gpus += [g for g in one if g.index == index]
            errors += [f"GPU {index}: {p}" for p in problems]
    apps, app_errors, _none = _tolerant_run([path, *APP_QUERY], parse_compute_apps, timeout, runner)
    unique = {g.index: g for g in gpus}
    return combine(sorted(unique.values(), key=lambda g: g.index), apps, path), errors + app_errors
