"""sglfleet.pve._config: parsing, normalisation and the desired-vs-current plan (no PVE needed)."""

from __future__ import annotations

import pytest

from sglfleet.pve import ContainerSpec, Plan, SpecError, parse_mib, plan_update, split_props

# What PVE shows for a container created from SPEC_ARGS (values in PVE's own spelling).
CURRENT = {
    "hostname": "sgl",
    "cores": 8,
    "memory": 8192,
    "swap": 0,
    "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:88:6D:53,ip=dhcp,type=veth",
    "features": "keyctl=1,nesting=1",
    "rootfs": "local-lvm:vm-200-disk-0,size=16G",
    "unprivileged": 1,
    "onboot": 1,
    "dev0": "/dev/nvidia0",
    "dev1": "/dev/nvidia-uvm,mode=0666",
    "ostype": "debian",
    "arch": "amd64",
    "digest": "abc",
}
SPEC_ARGS = {
    "vmid": 200,
    "hostname": "sgl",
    "cores": 8,
    "memory": "8G",
    "swap": 0,
    "rootfs": "local-lvm:16",
    "netif": {"net0": "bridge=vmbr0,name=eth0,ip=dhcp"},
    "features": ["nesting=true", "keyctl=1"],
    "unprivileged": True,
    "onboot": "yes",
    "devices": ["/dev/nvidia0", {"path": "/dev/nvidia-uvm", "mode": "666"}],
}


def spec(**changes):
    return ContainerSpec.from_args(**dict(SPEC_ARGS, **changes))


def test_same_config_in_other_spellings_is_no_change():
    plan = plan_update(spec(), CURRENT)
    assert not plan.changed, (plan.set, plan.delete, plan.resize)
    assert plan.before == plan.after


def test_removed_feature_option_is_a_change():
    plan = plan_update(spec(features=["nesting=1"]), CURRENT)
    assert plan.set == {"features": "nesting=1"}
    assert plan.before["features"] == "keyctl=1,nesting=1"


def test_empty_features_deletes_the_key():
    plan = plan_update(spec(features=[]), CURRENT)
    assert plan.delete == ["features"] and not plan.set
    assert "features" not in plan.after


def test_net_change_keeps_the_generated_mac():
    plan = plan_update(spec(netif={"net0": "name=eth0,bridge=vmbr0,ip=10.0.0.5/24,gw=10.0.0.1"}), CURRENT)
    assert plan.set == {"net0": "name=eth0,bridge=vmbr0,gw=10.0.0.1,hwaddr=BC:24:11:88:6D:53,ip=10.0.0.5/24"}


def test_removed_net_option_and_extra_interface_are_changes():
    current = dict(CURRENT, net0=CURRENT["net0"] + ",firewall=1", net1="name=eth1,bridge=vmbr1,type=veth")
    plan = plan_update(spec(), current)
    assert set(plan.set) == {"net0"} and "firewall" not in plan.set["net0"]
    assert plan.delete == ["net1"]


def test_devices_in_order_and_extra_device_deleted():
    current = dict(CURRENT, dev2="/dev/nvidia1")
    plan = plan_update(spec(), current)
    assert plan.delete == ["dev2"] and not plan.set
    plan = plan_update(spec(devices=["/dev/nvidia-uvm", "/dev/nvidia0"]), CURRENT)
    assert plan.set == {"dev0": "/dev/nvidia-uvm", "dev1": "/dev/nvidia0"}


def test_unmanaged_keys_are_left_alone():
    plan = plan_update(ContainerSpec.from_args(vmid=200, cores=8), dict(CURRENT, description="hand made"))
    assert not plan.changed
    assert plan.before == {"cores": "8"}


def test_scalar_change_and_pve_defaults():
    plan = plan_update(spec(cores=16, onboot=False), CURRENT)
    assert plan.set == {"cores": "16", "onboot": "0"}
    assert not plan.needs_restart()
    bare = {k: v for k, v in CURRENT.items() if k not in ("onboot", "swap")}
    # onboot absent means 0 and swap absent means 512 to PVE
    plan = plan_update(spec(onboot=False, swap=512), bare)
    assert not plan.changed


def test_features_and_devices_need_a_restart_when_running():
    assert plan_update(spec(features=["nesting=1"]), CURRENT).needs_restart()
    assert plan_update(spec(devices=["/dev/nvidia0"]), CURRENT).needs_restart()


def test_new_devices_and_mounts_hot_plug_changed_ones_wait():
    """pve-container vmconfig_hotplug_pending: a devN/mpN the config lacks is hot-plugged, one that
    exists is skipped ("don't try to hotplug over existing dev"), a deletion waits for the start."""
    more = [*SPEC_ARGS["devices"], "/dev/nvidiactl"]
    plan = plan_update(spec(devices=more), CURRENT)
    assert plan.keys() == ["dev2"] and not plan.needs_restart()
    plan = plan_update(spec(mounts={"mp0": "/srv/models,mp=/models,ro=1"}), CURRENT)
    assert plan.set == {"mp0": "/srv/models,mp=/models,ro=1"} and not plan.needs_restart()
    bound = dict(CURRENT, mp0="/srv/models,mp=/models,ro=1")
    assert not plan_update(spec(mounts={"mp0": "/srv/models/,ro=true,mp=/models"}), bound).changed
    assert plan_update(spec(mounts={"mp0": "/srv/other,mp=/models"}), bound).needs_restart()
    assert plan_update(spec(mounts={}), bound).needs_restart()
    assert plan_update(spec(devices=["/dev/nvidia1", SPEC_ARGS["devices"][1]]), CURRENT).needs_restart()
    assert not plan_update(spec(cores=4), CURRENT).needs_restart()


def test_rootfs_grow_shrink_and_move():
    plan = plan_update(spec(rootfs="local-lvm:32"), CURRENT)
    assert plan.resize == "32G" and not plan.set
    assert plan.after["rootfs"] == "local-lvm:vm-200-disk-0,size=32G"
    with pytest.raises(SpecError, match="cannot shrink"):
        plan_update(spec(rootfs="8G", storage="local-lvm"), CURRENT)
    with pytest.raises(SpecError, match="storage 'local-lvm', not 'ceph'"):
        plan_update(spec(rootfs="ceph:16"), CURRENT)


def test_unprivileged_cannot_change():
    with pytest.raises(SpecError) as err:
        plan_update(spec(unprivileged=False), CURRENT)
    assert err.value.field == "unprivileged" and "recreate" in str(err.value)


def test_create_params_in_pve_spelling():
    params = spec(
        ostemplate="local:vztmpl/debian-12.tar.zst", ssh_public_keys="ssh-ed25519 AAA x"
    ).create_params()
    assert params == {
        "vmid": 200,
        "ostemplate": "local:vztmpl/debian-12.tar.zst",
        "hostname": "sgl",
        "cores": "8",
        "memory": "8192",
        "swap": "0",
        "onboot": "1",
        "rootfs": "local-lvm:16",
        "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
        "features": "keyctl=1,nesting=1",
        "unprivileged": 1,
        "ssh-public-keys": "ssh-ed25519 AAA x",
        "dev0": "/dev/nvidia0",
        "dev1": "/dev/nvidia-uvm,mode=0666",
    }


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        ({"memory": "lots"}, "memory", "not a size"),
        ({"features": ["nesting"]}, "features", "needs a value"),
        ({"netif": {"eth0": "name=eth0"}}, "netif", "not netN"),
        ({"devices": ["nvidia0"]}, "devices[0]", "under /dev/"),
        ({"devices": [{"path": "/dev/x", "mode": "rw"}]}, "devices[0]", "octal"),
        ({"devices": ["/dev/x", "/dev/x"]}, "devices", "twice"),
        ({"rootfs": "32G"}, "rootfs", "names no storage"),
        ({"onboot": "maybe"}, "onboot", "not a boolean"),
        ({"vmid": 7}, "vmid", "100..999999999"),
        ({"cores": 0}, "cores", "positive"),
        ({"mounts": {"disk0": "/srv,mp=/m"}}, "mounts", "not mpN"),
        ({"mounts": {"mp0": "local-lvm:8,mp=/m"}}, "mounts.mp0", "directory on the PVE host"),
        ({"mounts": {"mp0": "/srv"}}, "mounts.mp0", "mp= must be the absolute path"),
        ({"mounts": {"mp0": "/srv,mp=/m,colour=red"}}, "mounts.mp0", "unknown mount point option"),
        ({"mounts": {"mp0": "/a,mp=/m", "mp1": "/b,mp=/m/"}}, "mounts", "same path"),
    ],
)
def test_bad_values_name_the_argument(args, field, words):
    base = {k: v for k, v in SPEC_ARGS.items() if k != "rootfs"}
    with pytest.raises(SpecError) as err:
        ContainerSpec.from_args(**dict(base, **args))
    assert err.value.field == field
    assert words in str(err.value)


def test_sizes_and_property_strings():
    assert parse_mib("memory", "8G") == 8192
    assert parse_mib("memory", "512M") == 512
    assert parse_mib("memory", 8) == 8
    assert split_props("local-lvm:vm-1-disk-0,size=8G") == ("local-lvm:vm-1-disk-0", {"size": "8G"})


@pytest.mark.parametrize(
    ("deleted", "pending"),
    [
        # pve-container 6.1.10 Config.pm:1657-1692: the delete loop of vmconfig_hotplug_pending
        ("memory", True),  # no branch for it: "skip", it stays pending until the next start
        ("swap", False),  # $hotplug_memory->(undef, 0)
        ("cpulimit", False),
        ("cpuunits", False),
        ("cores", False),  # a fastplug option (Config.pm:1612-1622)
        ("net1", False),  # m/^net(\d)$/: veth_delete
        ("net10", True),  # two digits do not match m/^net(\d)$/: "skip"
        ("unused0", False),
        ("unused12", False),
        ("mp0", True),
        ("dev0", True),
    ],
)
def test_a_running_ct_takes_a_deletion_at_once_exactly_as_pve_container_does(deleted, pending):
    assert Plan(delete=[deleted]).needs_restart() is pending
