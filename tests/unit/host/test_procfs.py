"""sglfleet.host._procfs on real processes and sockets of this machine (and a laid-out /proc for cgroups)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.polling import wait_until

from sglfleet.host import _procfs as procfs


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process with a spaced argument and an environment of its own, running until the test ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "two words"],
        stdin=subprocess.PIPE,
        env={**os.environ, "SGLFLEET_PROCFS_TEST": "a=b"},
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_cmdline_and_environ_of_a_running_process(sleeper: subprocess.Popen[bytes]) -> None:
    wait_until(
        lambda: "two words" in (procfs.cmdline(sleeper.pid) or ""), timeout=10, what="the child's exec"
    )
    assert procfs.cmdline(sleeper.pid) == f"{sys.executable} -c import sys; sys.stdin.read() two words"
    assert procfs.environ(sleeper.pid)["SGLFLEET_PROCFS_TEST"] == "a=b"
    assert sleeper.pid in set(procfs.pids())


def test_a_gone_process_reads_as_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert procfs.cmdline(gone.pid) is None
    assert procfs.environ(gone.pid) == {}
    assert procfs.unit(gone.pid) == ""
    assert not procfs.alive(gone.pid)


def test_a_zombie_is_not_alive_and_has_no_command_line() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: not procfs.alive(zombie.pid), timeout=30, what="the child exits (unreaped)")
        assert procfs.cmdline(zombie.pid) == ""  # still in /proc, but exited
    finally:
        zombie.wait()


def test_ancestors_reach_this_process_from_a_child(sleeper: subprocess.Popen[bytes]) -> None:
    found = procfs.ancestors(sleeper.pid)
    assert {sleeper.pid, os.getpid(), os.getppid()} <= found


def _cgroups(proc: Path, cgroups: dict[int, str]) -> None:
    for pid, cgroup in cgroups.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(cgroup)


def test_unit_is_the_one_systemd_names(tmp_path: Path) -> None:
    # What systemd's cg_pid_get_unit answers (cgroup-util.c v252:1162-1213): the first component after
    # the leading slices, "_"-unescaped; a user's own services are inside the system unit user@UID.
    cases = {
        10: ("0::/system.slice/system-sglang.slice/sglang@3.service\n", "sglang@3.service"),
        11: ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
        12: ("12:pids:/\n1:name=systemd:/system.slice/train.service\n", "train.service"),  # v1: name=systemd
        13: ("0::/init.scope/payload\n", "init.scope"),
        14: ("0::/\n", ""),
        15: ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.service\n", "user@1000.service"),
        16: ("0::/system.slice/train.service/payload/inner.scope\n", "train.service"),
        17: ("0::/system.slice/_cpu.service\n", "cpu.service"),  # cg_escape'd: "cpu" is a controller
        18: ("0::/system.slice\n", ""),  # only slices: no unit
        19: ("0::/lxc/200\n", ""),  # not a unit name: systemd says none (ps -o unit shows "-")
    }
    _cgroups(tmp_path, {pid: cgroup for pid, (cgroup, _) in cases.items()})
    assert {pid: procfs.unit(pid, tmp_path) for pid in cases} == {pid: u for pid, (_, u) in cases.items()}
    assert isinstance(procfs.unit(os.getpid()), str)


def test_unit_shifts_the_path_by_pid_1s_root(tmp_path: Path) -> None:
    # cg_pid_get_path_shifted / cg_get_root_path (cgroup-util.c v252:1034-1113): a container without a
    # cgroup namespace sees its PID 1 in /lxc/200/ns/init.scope, and paths below /lxc/200/ns are its own.
    _cgroups(tmp_path, {
        1: "0::/lxc/200/ns/init.scope\n",
        20: "0::/lxc/200/ns/user.slice/user-0.slice/session-3.scope\n",
        21: "0::/lxc/200/ns/system.slice/sglang@0.service\n",
    })  # fmt: skip
    assert [procfs.unit(pid, tmp_path) for pid in (20, 21)] == ["session-3.scope", "sglang@0.service"]


def test_listeners_name_the_process_holding_the_port() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as listening, socket.socket() as bound:
        listening.bind(("::", 0))
        listening.listen()
        bound.bind(("127.0.0.1", 0))  # bound, never listening: not a listener
        port, quiet = listening.getsockname()[1], bound.getsockname()[1]
        assert procfs.listeners([port, quiet]) == {port: [os.getpid()]}
    assert procfs.listeners([port]) == {}
