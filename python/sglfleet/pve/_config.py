"""The desired LXC container, PVE's property strings, and what differs between the two.

PVE hands config values back in its own spelling: `features: keyctl=1,nesting=1` sorted,
`net0` with a generated `hwaddr` and `type=veth` added, `rootfs` as an allocated volume with
`size=8G`, booleans as 0/1, `memory` in MiB. Comparing strings would see changes that are not
there (and miss ones that are), so both sides are parsed into key/value sets and normalised
before they are compared. Every key the spec manages is compared in full: an option removed
from `features` or from a `netN` is a change, not just an option added.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ContainerSpec",
    "Plan",
    "SpecError",
    "parse_mib",
    "plan_update",
    "split_props",
]

# MiB per unit, for memory and swap (PVE takes MiB).
_MIB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
# Bytes per unit, for disk sizes.
_BYTES = {"": 1024**3, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])?(?:i?B)?\s*$", re.IGNORECASE)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# Boolean options inside property strings, written by PVE as 0/1.
_FEATURE_BOOLS = {"nesting", "keyctl", "fuse", "mknod", "force_rw_sys"}
_NET_BOOLS = {"firewall", "link_down", "host-managed"}
_DEV_BOOLS = {"deny-write"}
_MP_BOOLS = {"ro", "backup", "acl", "quota", "replicate", "shared"}
_NET_KEY = re.compile(r"^net\d+$")
_DEV_KEY = re.compile(r"^dev\d+$")
_MP_KEY = re.compile(r"^mp\d+$")
# Options of an mpN (pve-container src/PVE/LXC/Config.pm, $mp_desc / $rootfs_desc).
_MP_OPTIONS = {"mp", "ro", "backup", "acl", "quota", "replicate", "shared", "mountoptions", "size"}
# What PVE assumes for a key missing from the config.
_DEFAULTS = {"onboot": "0", "memory": "512", "swap": "512", "unprivileged": "0"}
# pve-container 6.1.10 src/PVE/LXC/Config.pm:1612-1622, $LXC_FASTPLUG_OPTIONS (lock aside).
_FASTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript", "cores", "tags"}
# Keys PVE applies to a running container at once (pve-container: the fastplug options, the
# cgroup limits, network hotplug; Config.pm:1702-1720). Anything else waits in `pending` until the next start.
_HOT_KEYS = _FASTPLUG | {"cpulimit", "cpuunits", "memory", "swap"}
# Deletions a running container takes at once (Config.pm:1657-1692, vmconfig_hotplug_pending's delete loop):
# the fastplug options, swap, cpulimit, cpuunits, unusedN and netN for a single-digit N (`m/^net(\d)$/`).
# Deleting `memory` is not among them: it dies "skip" there and stays pending until the next start.
_HOT_DELETES = _FASTPLUG | {"swap", "cpulimit", "cpuunits"}
_HOT_DELETE_KEY = re.compile(r"^(net\d|unused\d+)$")
# Keys hot-plugged into a running container only when they are new: vmconfig_hotplug_pending adds
# an mpN or devN that the config lacks ("don't try to hotplug over existing mp/dev" otherwise).
_HOTPLUG_NEW_KEY = re.compile(r"^(mp|dev)\d+$")


class SpecError(ValueError):
    """A desired value that cannot be used; `field` names the argument."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


# ------------------------------------------------------------------ property strings


def split_props(text: str) -> tuple[str | None, dict[str, str]]:
    """('bare first value' or None, {key: value}) of a PVE property string such as `a,b=1,c=2`."""
    first: str | None = None
    props: dict[str, str] = {}
    for n, raw in enumerate(str(text).split(",")):
        part = raw.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        if eq:
            props[key.strip()] = value.strip()
        elif n == 0:
            first = part
        else:
            props[part] = ""
    return first, props


def format_props(props: Mapping[str, str], first: str | None = None, lead: Iterable[str] = ()) -> str:
    """A property string: `first`, then the `lead` keys in that order, then the rest sorted."""
    lead = [k for k in lead if k in props]
    keys = lead + sorted(k for k in props if k not in lead)
    parts = [first] if first else []
    parts += [f"{k}={props[k]}" for k in keys]
    return ",".join(parts)


def _bool01(field_name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value).strip().lower()
    if text in _TRUE:
        return "1"
    if text in _FALSE:
        return "0"
    raise SpecError(field_name, f"{value!r} is not a boolean (use true/false or 1/0)")


def _bools(props: dict[str, str], names: set[str], where: str) -> dict[str, str]:
    out = dict(props)
    for key in names & set(out):
        out[key] = _bool01(f"{where}.{key}", out[key])
    return out


def parse_mib(field_name: str, value: Any) -> int:
    """MiB in 8192, '8192', '8G', '512M' (a bare number is MiB, as PVE takes it)."""
    if isinstance(value, bool):
        raise SpecError(field_name, f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise SpecError(field_name, f"{value!r} is not a size (use MiB as a number, or 8G, 512M)")
    mib = float(m.group(1)) * _MIB[(m.group(2) or "").upper()]
    if mib != int(mib):
        raise SpecError(field_name, f"{value!r} is not a whole number of MiB")
    return int(mib)


def _size_bytes(field_name: str, text: str) -> int:
    """Bytes in a disk size: a bare number is GiB (PVE's new-volume syntax), else 512M, 8G, 1T."""
    m = _SIZE.match(str(text))
    if not m:
        raise SpecError(field_name, f"{text!r} is not a disk size (use GiB as a number, or 8G, 512M)")
    return int(float(m.group(1)) * _BYTES[(m.group(2) or "").upper()])


def _gib_text(size: int) -> str:
    gib = size / 1024**3
    return str(int(gib)) if gib == int(gib) else f"{gib:g}"


def _size_text(size: int) -> str:
    """PVE's spelling of a size: the largest unit that divides it."""
    for unit in "TGMK":
        if size and size % _BYTES[unit] == 0:
            return f"{size // _BYTES[unit]}{unit}"
    return str(size)


# ------------------------------------------------------------------ value kinds


def _net(field_name: str, text: str) -> dict[str, str]:
    first, props = split_props(text)
    if first is not None:
        raise SpecError(field_name, f"{first!r} has no key: write it as key=value (e.g. name=eth0)")
    props = _bools(props, _NET_BOOLS, field_name)
    if "hwaddr" in props:
        props["hwaddr"] = props["hwaddr"].upper()
    return props


def _net_view(props: dict[str, str], keep_hwaddr: bool) -> dict[str, str]:
    """What of a netN is compared: not `type=veth` (PVE adds it), not a generated hwaddr."""
    view = {k: v for k, v in props.items() if not (k == "type" and v == "veth")}
    if not keep_hwaddr:
        view.pop("hwaddr", None)
    return view


def _device(field_name: str, item: Any) -> dict[str, str]:
    """A devN value as {path, gid, uid, mode, deny-write}, from '/dev/x', 'path,mode=..' or a dict."""
    if isinstance(item, Mapping):
        props = {str(k).replace("_", "-"): str(v) for k, v in item.items() if v is not None}
        path = props.pop("path", None)
    else:
        path, props = split_props(str(item))
        path = props.pop("path", path)
    if not path or not str(path).startswith("/dev/"):
        raise SpecError(field_name, f"{item!r}: a device needs a path under /dev/ (e.g. /dev/nvidia0)")
    unknown = set(props) - {"gid", "uid", "mode", "deny-write"}
    if unknown:
        raise SpecError(field_name, f"{item!r}: unknown device option(s) {sorted(unknown)}")
    props = _bools(props, _DEV_BOOLS, field_name)
    for key in ("gid", "uid"):
        if key in props and not props[key].isdigit():
            raise SpecError(field_name, f"{item!r}: {key} must be a number")
    if "mode" in props:
        try:
            props["mode"] = f"{int(props['mode'], 8):04o}"
        except ValueError:
            raise SpecError(field_name, f"{item!r}: mode must be octal, e.g. 0666") from None
    return dict(props, path=str(path))


def _mount(field_name: str, item: Any) -> dict[str, str]:
    """An mpN bind mount as {volume, mp, ro, ...} from 'HOSTDIR,mp=/path[,ro=1]' or a dict."""
    if isinstance(item, Mapping):
        props = {str(k): str(v) for k, v in item.items() if v is not None}
        volume = props.pop("volume", None) or props.pop("source", None)
    else:
        volume, props = split_props(str(item))
        volume = props.pop("volume", volume)
    if not volume or not volume.startswith("/"):
        raise SpecError(
            field_name,
            f"{item!r}: give a directory on the PVE host to bind-mount (an absolute path, e.g. "
            "/srv/models,mp=/models,ro=1); storage volumes are not managed here",
        )
    unknown = set(props) - _MP_OPTIONS
    if unknown:
        raise SpecError(field_name, f"{item!r}: unknown mount point option(s) {sorted(unknown)}")
    if not props.get("mp", "").startswith("/"):
        raise SpecError(field_name, f"{item!r}: mp= must be the absolute path inside the container")
    props = _bools(props, _MP_BOOLS, field_name)
    return dict(props, volume=volume.rstrip("/") or "/", mp=props["mp"].rstrip("/") or "/")


def mount_value(mount: Mapping[str, str]) -> str:
    """The mpN property string of a parsed mount point."""
    rest = {k: v for k, v in mount.items() if k != "volume"}
    return format_props(rest, first=mount["volume"], lead=("mp",))


def device_value(dev: Mapping[str, str]) -> str:
    """The devN property string of a parsed device."""
    rest = {k: v for k, v in dev.items() if k != "path"}
    return format_props(rest, first=dev["path"])


def _features(field_name: str, items: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        first, props = split_props(str(item))
        if first is not None:
            raise SpecError(field_name, f"{item!r} needs a value, e.g. {first}=1")
        out.update(props)
    out = _bools(out, _FEATURE_BOOLS, field_name)
    if "mount" in out:
        out["mount"] = ";".join(sorted(t for t in out["mount"].split(";") if t))
    return out


def _features_current(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        return _features("features", [text])
    except SpecError:
        return split_props(text)[1]


@dataclass(frozen=True)
class RootFs:
    """The root disk: storage, size in bytes, and its other options (mountoptions, acl, ...)."""

    storage: str
    size: int
    options: dict[str, str] = field(default_factory=dict)

    def create_value(self) -> str:
        """The value for POST /lxc: `storage:GiB` allocates a new volume."""
        return format_props(self.options, first=f"{self.storage}:{_gib_text(self.size)}")


def _rootfs(value: Any, storage: str | None) -> RootFs:
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
    else:
        text = str(value).strip()
    first, props = split_props(text)
    first = props.pop("volume", first)
    if first is None:
        raise SpecError("rootfs", f"{value!r}: give the size, e.g. 'local-lvm:32' or '32G'")
    if ":" in first:
        store, _, size = first.partition(":")
    else:
        store, size = storage or "", first
    if not store:
        raise SpecError("rootfs", f"{value!r} names no storage: write 'STORAGE:GiB' or set storage")
    if "size" in props:
        size = props.pop("size")
    props.pop("mp", None)
    return RootFs(storage=store, size=_size_bytes("rootfs", size), options=props)


# ------------------------------------------------------------------ the spec


@dataclass(frozen=True)
class ContainerSpec:
    """The container as it should be. None means 'not managed': left as PVE has it."""

    vmid: int
    hostname: str | None = None
    ostemplate: str | None = None
    storage: str | None = None
    cores: int | None = None
    memory: int | None = None
    swap: int | None = None
    rootfs: RootFs | None = None
    netif: dict[str, dict[str, str]] | None = None
    features: dict[str, str] | None = None
    unprivileged: bool | None = None
    onboot: bool | None = None
    ssh_public_keys: str | None = None
    devices: list[dict[str, str]] | None = None
    mounts: dict[str, dict[str, str]] | None = None

    @classmethod
    def from_args(
        cls,
        *,
        vmid: int,
        hostname: str | None = None,
        ostemplate: str | None = None,
        storage: str | None = None,
        cores: int | None = None,
        memory: Any = None,
        swap: Any = None,
        rootfs: Any = None,
        netif: Mapping[str, str] | None = None,
        features: Iterable[str] | None = None,
        unprivileged: Any = None,
        onboot: Any = None,
        ssh_public_keys: str | None = None,
        devices: Iterable[Any] | None = None,
        mounts: Mapping[str, Any] | None = None,
    ) -> ContainerSpec:
        """Parse module-style arguments; a SpecError names the first bad one."""
        if not isinstance(vmid, int) or isinstance(vmid, bool) or not 100 <= vmid <= 999_999_999:
            raise SpecError("vmid", f"{vmid!r} is not a PVE guest id (100..999999999)")
        nets = None
        if netif is not None:
            nets = {}
            for key, value in netif.items():
                if not _NET_KEY.match(str(key)):
                    raise SpecError("netif", f"key {key!r} is not netN (net0, net1, ...)")
                nets[str(key)] = _net(f"netif.{key}", str(value))
        devs = None
        if devices is not None:
            devs = [_device(f"devices[{n}]", item) for n, item in enumerate(devices)]
            paths = [d["path"] for d in devs]
            if len(set(paths)) != len(paths):
                raise SpecError("devices", "a device path is listed twice")
        mps = None if mounts is None else _mounts(mounts)
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
            raise SpecError("cores", f"{cores!r} is not a positive number of cores")
        return cls(
            vmid=vmid,
            hostname=hostname,
            ostemplate=ostemplate,
            storage=storage,
            cores=cores,
            memory=None if memory is None else parse_mib("memory", memory),
            swap=None if swap is None else parse_mib("swap", swap),
            rootfs=None if rootfs is None else _rootfs(rootfs, storage),
            netif=nets,
            features=None if features is None else _features("features", features),
            unprivileged=None if unprivileged is None else _bool01("unprivileged", unprivileged) == "1",
            onboot=None if onboot is None else _bool01("onboot", onboot) == "1",
            ssh_public_keys=ssh_public_keys,
            devices=devs,
            mounts=mps,
        )

    def bind_mounts(self) -> list[str]:
        """mpN keys that bind-mount a host directory (PVE: root@pam only)."""
        return sorted((self.mounts or {}), key=lambda k: int(k[2:]))

    def device_keys(self) -> dict[str, dict[str, str]]:
        """dev0..devN of the devices, in the order given."""
        return {f"dev{n}": dev for n, dev in enumerate(self.devices or [])}

    def scalars(self) -> dict[str, str]:
        """The plain values managed, as PVE writes them."""
        out = {}
        for key in ("hostname", "cores", "memory", "swap"):
            value = getattr(self, key)
            if value is not None:
                out[key] = str(value)
        if self.onboot is not None:
            out["onboot"] = "1" if self.onboot else "0"
        return out

    def create_params(self) -> dict[str, Any]:
        """The body of POST /nodes/{node}/lxc."""
        if not self.ostemplate:
            raise SpecError("ostemplate", f"CT {self.vmid} does not exist and no ostemplate is given")
        params: dict[str, Any] = {"vmid": self.vmid, "ostemplate": self.ostemplate}
        params.update(self.scalars())
        if self.storage:
            params["storage"] = self.storage
        if self.rootfs is not None:
            params["rootfs"] = self.rootfs.create_value()
        for key, props in (self.netif or {}).items():
            params[key] = format_props(props, lead=("name",))
        if self.features:
            params["features"] = format_props(self.features)
        if self.unprivileged is not None:
            params["unprivileged"] = 1 if self.unprivileged else 0
        if self.ssh_public_keys:
            params["ssh-public-keys"] = self.ssh_public_keys
        for key, dev in self.device_keys().items():
            params[key] = device_value(dev)
        for key, mount in (self.mounts or {}).items():
            params[key] = mount_value(mount)
        return params

    def expected_config(self) -> dict[str, str]:
        """The managed keys as a fresh container shows them (for check mode's 'after')."""
        params = self.create_params()
        skip = ("vmid", "ostemplate", "storage", "ssh-public-keys")
        out = {k: str(v) for k, v in params.items() if k not in skip}
        if self.rootfs is not None:
            size = _size_text(self.rootfs.size)
            out["rootfs"] = format_props(
                dict(self.rootfs.options, size=size), first=f"{self.rootfs.storage}:(new)"
            )
        return out


def _mounts(mounts: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, value in mounts.items():
        if not _MP_KEY.match(str(key)):
            raise SpecError("mounts", f"key {key!r} is not mpN (mp0, mp1, ...)")
        out[str(key)] = _mount(f"mounts.{key}", value)
    targets = [m["mp"] for m in out.values()]
    if len(set(targets)) != len(targets):
        raise SpecError("mounts", "two mount points mount at the same path in the container")
    return out


# ------------------------------------------------------------------ the difference


@dataclass
class Plan:
    """What to do to an existing container: PUT `set` and `delete`, grow the root disk to `resize`."""

    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    resize: str | None = None
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete or self.resize)

    def keys(self) -> list[str]:
        """Every key that changes."""
        return sorted(set(self.set) | set(self.delete) | ({"rootfs"} if self.resize else set()))

    def needs_restart(self) -> bool:
        """True if a running container only takes part of this at its next start.

        As pve-container's vmconfig_hotplug_pending decides: the fastplug options and the cgroup
        limits apply at once, netN is hot-plugged, and an mpN or devN the config lacks is hot-plugged
        (a new GPU node appears in the running CT); a changed or removed mpN/devN waits in pending.
        """
        for key in self.set:
            if key in _HOT_KEYS or _NET_KEY.match(key):
                continue
            if _HOTPLUG_NEW_KEY.match(key) and key not in self.before:
                continue
            return True
        return any(k not in _HOT_DELETES and not _HOT_DELETE_KEY.match(k) for k in self.delete)


def _compare(plan: Plan, key: str, current: str | None, want: str | None, same: bool) -> None:
    """Record key in before/after; schedule a set (want) or a delete (want None) unless same."""
    if current is not None:
        plan.before[key] = current
    if same:
        if current is not None:
            plan.after[key] = current
        return
    if want is None:
        plan.delete.append(key)
    else:
        plan.set[key] = want
        plan.after[key] = want


def plan_update(spec: ContainerSpec, current: Mapping[str, Any]) -> Plan:
    """The changes that make `current` (GET .../config, pending included) match `spec`."""
    cur = {k: str(v) for k, v in current.items() if k not in ("digest", "lock")}
    _refuse_privilege_change(spec, cur)
    plan = Plan()
    for key, want in spec.scalars().items():
        have = cur.get(key)
        _compare(plan, key, have, want, (have if have is not None else _DEFAULTS.get(key)) == want)
    if spec.features is not None:
        have_f = _features_current(cur.get("features"))
        want_text = format_props(spec.features) if spec.features else None
        _compare(plan, "features", cur.get("features"), want_text, have_f == spec.features)
    if spec.netif is not None:
        _plan_nets(plan, spec.netif, cur)
    if spec.devices is not None:
        _plan_keyed(plan, "dev", spec.device_keys(), cur)
    if spec.mounts is not None:
        _plan_keyed(plan, "mp", spec.mounts, cur)
    if spec.rootfs is not None and "rootfs" in cur:
        _plan_rootfs(plan, spec, cur["rootfs"])
    return plan


def _refuse_privilege_change(spec: ContainerSpec, cur: Mapping[str, str]) -> None:
    if spec.unprivileged is None:
        return
    have = cur.get("unprivileged", _DEFAULTS["unprivileged"]) == "1"
    if have != spec.unprivileged:
        kind = "unprivileged" if have else "privileged"
        raise SpecError(
            "unprivileged",
            f"CT {spec.vmid} is {kind} and PVE cannot change that on an existing container; "
            f"set unprivileged: {str(have).lower()} or destroy and recreate the container",
        )


def _plan_nets(plan: Plan, want: Mapping[str, dict[str, str]], cur: Mapping[str, str]) -> None:
    for key in sorted(set(want) | {k for k in cur if _NET_KEY.match(k)}):
        want_props = want.get(key)
        have_text = cur.get(key)
        if want_props is None:
            _compare(plan, key, have_text, None, have_text is None)
            continue
        have_props = _net(key, have_text) if have_text else None
        keep_mac = "hwaddr" in want_props
        want_view = _net_view(want_props, keep_mac)
        same = have_props is not None and _net_view(have_props, keep_mac) == want_view
        put = dict(want_props)
        if have_props and not keep_mac and "hwaddr" in have_props:
            put["hwaddr"] = have_props["hwaddr"]  # keep the MAC: PVE would make up a new one
        _compare(plan, key, have_text, format_props(put, lead=("name",)), same)


def _mount_current(key: str, text: str) -> dict[str, str] | None:
    """An mpN as PVE holds it; a storage volume (not a bind mount) parses to its raw options."""
    try:
        return _mount(key, text)
    except SpecError:
        volume, props = split_props(text)
        return dict(props, volume=str(volume))


# How devN and mpN are told apart, parsed and written: (key pattern, length of the prefix, parse, render).
_KEYED = {
    "dev": (_DEV_KEY, 3, _device, device_value),
    "mp": (_MP_KEY, 2, _mount_current, mount_value),
}


def _plan_keyed(plan: Plan, kind: str, want: Mapping[str, dict[str, str]], cur: Mapping[str, str]) -> None:
    """devN or mpN: every key of that kind is managed; a key not declared is deleted."""
    pattern, prefix, parse, render = _KEYED[kind]
    keys = set(want) | {k for k in cur if pattern.match(k)}
    for key in sorted(keys, key=lambda k: int(k[prefix:])):
        have_text = cur.get(key)
        want_item = want.get(key)
        have_item = parse(key, have_text) if have_text else None
        _compare(plan, key, have_text, render(want_item) if want_item else None, have_item == want_item)


def _plan_rootfs(plan: Plan, spec: ContainerSpec, have_text: str) -> None:
    want = spec.rootfs
    assert want is not None
    volume, props = split_props(have_text)
    volume = props.pop("volume", volume) or ""
    have_size = _size_bytes("rootfs", props.pop("size")) if props.get("size") else 0
    store = volume.split(":", 1)[0]
    if store != want.storage:
        raise SpecError(
            "rootfs",
            f"CT {spec.vmid}'s root disk is {volume} on storage {store!r}, not {want.storage!r}; "
            "moving it is not done here (use `pct move-volume`), or set rootfs to its storage",
        )
    if want.size < have_size:
        raise SpecError(
            "rootfs",
            f"CT {spec.vmid}'s root disk is {_size_text(have_size)}; "
            f"PVE cannot shrink it to {_size_text(want.size)}",
        )
    plan.before["rootfs"] = have_text
    size = have_size
    if want.size > have_size:
        plan.resize = _size_text(want.size)
        size = want.size
    after = format_props(dict(want.options, size=_size_text(size)), first=volume)
    plan.after["rootfs"] = after
    if want.options != props:
        plan.set["rootfs"] = format_props(dict(want.options, size=_size_text(have_size)), first=volume)
