"""The lab's PVE API: fakepve, with its containers realised as real LXC containers.

fakepve keeps the API's state and rules (schema checks, permissions, locks, tasks, digests, pending
changes); LabPve hooks in where PVE itself would touch a container:

- every task on a container ends by reconciling the real container with fakepve's view of it
  (created when it is in the config but not on disk, killed when it should be stopped, removed when
  the CT was destroyed), so create / stop / destroy are real;
- starts (status/start, create with start=1, reboot) run `lxc-start`, after pending config was applied;
- clean shutdowns (status/shutdown, reboot) ask systemd to power off and honour timeout / forceStop;
- config changes of hostname, cores, memory and swap are written to the LXC config (and applied live
  where a running container can take them: cgroup limits, hostname).

What the lab cannot realise is accepted and logged in the task log: devN (no GPUs here), netN (the
container shares the host's network), mpN, rootfs sizes. Status reads ask LXC, so a container that
powered itself off shows as stopped. Every LXC call runs in a worker thread: the event loop keeps
answering while a container boots.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fakepve.lxc import FakeCt
from fakepve.model import PveError, TaskError
from fakepve.server import FakePve

from .container import LxcError, LxcHost, Shape
from .settings import LabSettings

LOG = logging.getLogger("sglfleet.lab")
# Config keys the lab realises; the rest of a container's config is kept by fakepve only.
REALISED = ("hostname", "cores", "memory", "swap")
IGNORED = {
    r"dev\d+": "device passthrough ignored: the lab has no GPUs",
    r"net\d+": "network device ignored: the lab container shares the host's network",
    r"mp\d+": "mount point ignored by the lab",
    r"features": "feature flags ignored: the lab container is privileged and may do what they allow",
}


class LabPve(FakePve):
    """fakepve serving settings.url, node settings.node, with real LXC containers behind /lxc."""

    def __init__(self, settings: LabSettings, lxc: LxcHost | None = None) -> None:
        super().__init__(
            user=settings.user, password=settings.password, host=settings.host, port=settings.port
        )
        self.settings = settings
        self.lxc = lxc or LxcHost(settings)
        # fakepve's own task delays are all 0; at time scale 1 its lock waits and timeouts are PVE's
        # real ones, and tasks run in the background (the request returns the UPID at once) as on PVE.
        self.time_scale = 1.0
        self.nodes = {settings.node: {"online": True}}
        self.apitokens[settings.token_id] = settings.token_secret
        # PVE's permission rules on (the default None lets anyone do anything): root@pam may do all,
        # its API token all but what PVE keeps for root@pam itself (devN, privileged features, ...).
        self.acl = {}
        local = self.storages[settings.template_storage]
        local["path"] = str(settings.cache_dir)
        self.refresh_template()
        # vmid -> create-only parameters (ostemplate, ssh-public-keys, password) until it is realised
        self._create_params: dict[int, dict[str, Any]] = {}
        # vmid -> tasks in flight; a status read does not trust LXC's answer while one runs
        self._busy: dict[int, int] = {}
        self._generation: dict[int, int] = {}

    # ------------------------------------------------------------ setup

    def refresh_template(self) -> None:
        """List the template on its storage (or list nothing when it is missing)."""
        volumes = self.storages[self.settings.template_storage].setdefault("volumes", {})
        volname = f"vztmpl/{self.settings.template_name}"
        path = self.settings.template_path
        if path.is_file():
            stat = path.stat()
            volumes[volname] = {
                "content": "vztmpl",
                "format": "tzst",
                "size": stat.st_size,
                "ctime": int(stat.st_mtime),
            }
        else:
            volumes.pop(volname, None)

    def adopt(self) -> list[int]:
        """Take back the containers an earlier run of the bridge made (their PVE config is saved next to
        them); returns their vmids."""
        out = []
        for vmid in self.lxc.vmids():
            saved = self.lxc.path(vmid) / "pve.json"
            if not saved.is_file() or self.ct(vmid):
                continue
            data = json.loads(saved.read_text())
            state = self.lxc.state(vmid)
            ct = self.add_ct(
                vmid,
                node=self.settings.node,
                status="running" if state.running else "stopped",
                config=data["config"],
                pending=data.get("pending"),
                defaults=False,
            )
            ct.pid = state.pid
            out.append(vmid)
            LOG.info("adopted CT %s (%s)", vmid, ct.status)
        return out

    def _save(self, ct: FakeCt) -> None:
        if self.lxc.exists(ct.vmid) and self.ct(ct.vmid) is ct:
            config = dict((k, v) for k, v in ct.config.items() if k != "lock")
            saved = self.lxc.path(ct.vmid) / "pve.json"
            saved.write_text(json.dumps({"config": config, "pending": ct.pending}, indent=1, sort_keys=True))

    # ------------------------------------------------------------ create

    async def _lxc_create(self, user: str, v: dict) -> str:
        vmid = int(v["vmid"])
        port = self.settings.ssh_port(vmid)
        if port > 65535:
            raise PveError(
                400,
                "Parameter verification failed.",
                {
                    "vmid": f"the lab takes vmids up to {65535 - self.settings.ssh_port_base} "
                    f"(CT N's sshd listens on port {self.settings.ssh_port_base} + N)"
                },
            )
        self.refresh_template()
        self._create_params[vmid] = {
            "ostemplate": v.get("ostemplate"),
            "ssh-public-keys": v.get("ssh-public-keys") or "",
            "password": v.get("password"),
        }
        try:
            return await super()._lxc_create(user, v)
        except BaseException:
            self._create_params.pop(vmid, None)
            raise

    def _template_file(self, ostemplate: str | None) -> Path:
        sid, colon, volname = str(ostemplate or "").partition(":")
        if not colon:
            return Path(sid)
        store = self.storages.get(sid, {})
        return Path(store.get("path", "/var/lib/vz")) / "template" / "cache" / volname.split("/", 1)[-1]

    async def _make_container(self, ct: FakeCt) -> list[str]:
        """Make the real container of ct from its create parameters."""
        params = self._create_params.pop(ct.vmid, {})
        template = self._template_file(params.get("ostemplate"))
        shape = Shape.from_config(ct.vmid, ct.config)
        start = time.monotonic()
        try:
            await asyncio.to_thread(
                self.lxc.create,
                ct.vmid,
                template,
                shape,
                params.get("ssh-public-keys", ""),
                params.get("password"),
            )
        except LxcError as e:
            raise TaskError(str(e)) from e
        LOG.info("CT %s made from %s in %.1f s", ct.vmid, template, time.monotonic() - start)
        port = self.lxc.ssh_port(ct.vmid)
        notes = [f"lab: container {ct.vmid} made from {template.name}, sshd on 127.0.0.1:{port}"]
        if str(ct.config.get("unprivileged", "0")) == "1":
            notes.append("lab: unprivileged=1 is kept in the config, but the lab container is privileged")
        return notes + self._ignored(ct.config)

    @staticmethod
    def _ignored(config: dict) -> list[str]:
        notes = []
        for key in sorted(config):
            for pattern, why in IGNORED.items():
                if re.fullmatch(pattern, key):
                    notes.append(f"lab: {key}: {why}")
                    LOG.info("%s: %s", key, why)
        return notes

    # ------------------------------------------------------------ tasks

    async def task(  # noqa: PLR0917 - fakepve's signature
        self,
        node: str,
        ttype: str,
        tid: Any,
        user: str,
        body: Callable[[], Awaitable[Any]],
        vm: Any = None,
        lock: bool = True,
        log: Any = (),
    ) -> str:
        """fakepve's task; one on a container ends by making the real container match."""
        if not isinstance(vm, FakeCt):
            return await super().task(node, ttype, tid, user, body, vm=vm, lock=lock, log=log)
        ct = vm
        # The task's record, once fakepve made it: the lab's notes go in its log one line each.
        made: dict[str, dict] = {}

        async def realised() -> str | None:
            self._busy[ct.vmid] = self._busy.get(ct.vmid, 0) + 1
            try:
                try:
                    note = await body()
                except TaskError:
                    await self._reconcile(ct, quiet=True)
                    raise
                notes = await self._reconcile(ct)
                lines = [str(n) for n in [note, *notes] if n]
                if "task" in made:
                    made["task"]["log"].extend(lines)
                    return None
                return "\n".join(lines) or None
            finally:
                self._busy[ct.vmid] -= 1
                self._generation[ct.vmid] = self._generation.get(ct.vmid, 0) + 1

        upid = await super().task(node, ttype, tid, user, realised, vm=vm, lock=lock, log=log)
        if upid in self.tasks:
            made["task"] = self.tasks[upid]
        return upid

    async def _reconcile(self, ct: FakeCt, quiet: bool = False) -> list[str]:
        """Make the real container match fakepve's view of ct; returns notes for the task log."""
        notes: list[str] = []
        try:
            exists = await asyncio.to_thread(self.lxc.exists, ct.vmid)
            if self.ct(ct.vmid) is None:
                self._create_params.pop(ct.vmid, None)
                if exists:
                    await asyncio.to_thread(self.lxc.destroy, ct.vmid)
                    notes.append(f"lab: container {ct.vmid} removed")
                return notes
            if self.ct(ct.vmid) is not ct:
                return notes
            if not exists and not ct.config.get("lock"):
                notes += await self._make_container(ct)
            state = await asyncio.to_thread(self.lxc.state, ct.vmid)
            if ct.status != "running" and state.running:
                await asyncio.to_thread(self.lxc.stop, ct.vmid)
                notes.append(f"lab: container {ct.vmid} killed")
            elif (
                ct.status == "running"
                and not state.running
                and await asyncio.to_thread(self.lxc.exists, ct.vmid)
            ):
                notes.append(await self._real_start(ct))
            await asyncio.to_thread(self._save, ct)
        except (TaskError, LxcError) as e:
            if not quiet:
                raise TaskError(str(e)) from e
            LOG.warning("CT %s: %s", ct.vmid, e)
        return notes

    # ------------------------------------------------------------ power

    async def _start_steps(self, ct: FakeCt, user: str, skiplock: bool = False) -> None:
        """fakepve's start worker, with a real lxc-start once pending config is applied."""
        if ct.template:
            raise TaskError("you can't start a CT if it's a template")
        if not skiplock:
            self._task_lock(ct, allow=("mounted",))
        if not await asyncio.to_thread(self.lxc.exists, ct.vmid):
            await self._make_container(ct)
        self._apply(ct)
        await self._real_start(ct)

    async def _real_start(self, ct: FakeCt) -> str:
        try:
            await asyncio.to_thread(self.lxc.configure, ct.vmid, Shape.from_config(ct.vmid, ct.config))
            state = await asyncio.to_thread(self.lxc.start, ct.vmid)
        except LxcError as e:
            ct.status, ct.pid = "stopped", None
            raise TaskError(f"startup for container '{ct.vmid}' failed: {e}") from e
        ct.status = "running"
        ct.started_at = time.time()
        ct.pid = state.pid
        LOG.info("CT %s started, init pid %s", ct.vmid, state.pid)
        return f"lab: container {ct.vmid} started, init pid {state.pid}"

    async def _ct_powerdown(self, ct: FakeCt, timeout: Any, force: bool) -> None:  # noqa: ASYNC109
        """A clean shutdown: systemd powers off within timeout, or the container is killed (force) or
        the task fails ('container did not stop'), as PVE's vm_stop does."""
        stopped = await asyncio.to_thread(self.lxc.shutdown, ct.vmid, float(timeout))
        if not stopped:
            if not force:
                raise TaskError("container did not stop")
            await asyncio.to_thread(self.lxc.stop, ct.vmid)
        ct.status = "stopped"
        ct.pid = None

    # ------------------------------------------------------------ config

    async def _update_config(self, ct: FakeCt, user: str, values: dict, deletes: list, reverts: list) -> None:
        before = Shape.from_config(ct.vmid, ct.config)
        await super()._update_config(ct, user, values, deletes, reverts)
        self._ignored(values)
        after = Shape.from_config(ct.vmid, ct.config)
        if await asyncio.to_thread(self.lxc.exists, ct.vmid):
            if after != before:
                try:
                    await asyncio.to_thread(self.lxc.configure, ct.vmid, after)
                except LxcError as e:
                    raise PveError(500, f"lab: applying {after} to container {ct.vmid} failed: {e}") from e
            await asyncio.to_thread(self._save, ct)

    # ------------------------------------------------------------ status

    async def _refresh(self) -> None:
        """Read each container's state from LXC (a container may power itself off)."""
        for ct in list(self.cts):
            if self._busy.get(ct.vmid) or ct.lock_holder is not None:
                continue
            generation = self._generation.get(ct.vmid, 0)
            state = await asyncio.to_thread(self.lxc.state, ct.vmid)
            if (
                self._busy.get(ct.vmid)
                or self._generation.get(ct.vmid, 0) != generation
                or self.ct(ct.vmid) is not ct
            ):
                continue
            if not await asyncio.to_thread(self.lxc.exists, ct.vmid):
                continue
            if state.running and ct.status != "running":
                ct.status, ct.pid, ct.started_at = "running", state.pid, time.time()
            elif not state.running and ct.status == "running":
                LOG.info("CT %s stopped by itself", ct.vmid)
                ct.status, ct.pid = "stopped", None
            elif state.running:
                ct.pid = state.pid

    async def _lxc_status_current(self, user: str, v: dict) -> dict:
        await self._refresh()
        return await super()._lxc_status_current(user, v)

    async def _lxc_list(self, user: str, v: dict) -> list:
        await self._refresh()
        return await super()._lxc_list(user, v)

    async def _resources(self, request: Any) -> Any:
        await self._refresh()
        return await super()._resources(request)
