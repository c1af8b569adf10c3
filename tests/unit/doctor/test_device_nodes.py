"""Role pve_host and the doctor agree on a PVE node's device nodes: one `expected_nodes` behind both
(`node_table` for the role's module device_nodes, `check_host` for the doctor's table)."""

from __future__ import annotations

import pytest

from sglfleet.doctor import HostExpect, Status, char_majors, check_host, node_table

CURRENT = (
    "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n236 nvidia-caps\n511 nvidia-uvm\n\n"
    "Block devices:\n  8 sd\n"
)
OLD = "Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n510 nvidia-uvm\n"
GOOD = [
    "/dev/nvidia0 195:0 character special file",
    "/dev/nvidia1 195:1 character special file",
    "/dev/nvidiactl 195:255 character special file",
    "/dev/nvidia-uvm 511:0 character special file",
    "/dev/nvidia-uvm-tools 511:1 character special file",
]


@pytest.mark.parametrize(("text", "uvm"), [(CURRENT, "511"), (OLD, "510")])
def test_the_nvidia_major_is_read_under_its_current_and_its_old_name(text: str, uvm: str) -> None:
    """A 580+ nv.c registers 195 as "nvidia" and "nvidiactl"; drivers before the open modules as
    "nvidia-frontend" (nv-frontend.c); nvidia-uvm's major is dynamic."""
    assert node_table(1, char_majors(text), []).majors == {"nvidia": "195", "nvidia-uvm": uvm}


def test_a_node_with_every_node_right_has_nothing_wrong() -> None:
    table = node_table(2, char_majors(CURRENT), GOOD)
    assert table.expected == [line.removesuffix(" character special file") for line in GOOD]
    assert table.found == table.expected and table.wrong == []


def test_missing_wrong_and_not_character_nodes_are_named_by_path() -> None:
    stat = [
        GOOD[0],
        "/dev/nvidia1 195:7 character special file",  # another minor
        "/dev/nvidiactl 0:0 regular empty file",  # not a device
        GOOD[3],  # nvidia-uvm-tools missing (stat printed nothing for it)
    ]
    table = node_table(2, char_majors(CURRENT), stat)
    assert table.wrong == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm-tools"]


def test_a_module_not_loaded_leaves_its_major_unknown_and_its_nodes_wrong() -> None:
    table = node_table(1, char_majors("Character devices:\n195 nvidia\n195 nvidiactl\n"), GOOD)
    assert table.majors["nvidia-uvm"] == "?"
    assert "/dev/nvidia-uvm ?:0" in table.expected and "/dev/nvidia-uvm" in table.wrong


def test_the_doctor_and_the_role_expect_the_same_nodes() -> None:
    nodes = {
        line.split()[0].removeprefix("/dev/"): {
            "char": True,
            "major": int(line.split()[1].split(":")[0]),
            "minor": int(line.split()[1].split(":")[1]),
        }
        for line in GOOD
    }
    probe = {"proc_devices": char_majors(CURRENT), "nodes": nodes}
    rows = check_host("kpro6", HostExpect(role="node", gpus_expected=True, gpu_count=2), probe)
    (row,) = [r for r in rows if r.check == "device nodes"]
    assert row.status is Status.OK
    assert node_table(2, char_majors(CURRENT), GOOD).wrong == []
    del nodes["nvidia-uvm-tools"]
    rows = check_host("kpro6", HostExpect(role="node", gpus_expected=True, gpu_count=2), probe)
    (row,) = [r for r in rows if r.check == "device nodes"]
    assert row.status is Status.BLOCKER and "/dev/nvidia-uvm-tools" in row.found
    assert node_table(2, char_majors(CURRENT), GOOD[:-1]).wrong == ["/dev/nvidia-uvm-tools"]
