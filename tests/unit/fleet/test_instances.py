"""Instance planning (sglfleet.fleet._instances, _instances_observe, _instances_plan) and the module
sglang_instances, without the lab."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from support.module_runner import assert_examples_use_documented_options, module_doc, run_module

from sglfleet.fleet import _instances as inst
from sglfleet.fleet import _instances_observe as obs
from sglfleet.fleet import _instances_plan as plan_mod

pytestmark = pytest.mark.timeout(60)

EIGHT = inst.GpuInventory(gpu_count=8, nvidia_smi_found=True)
NONE = inst.GpuInventory()


def spec(**kw: object) -> inst.FleetSpec:
    base: dict[str, object] = {
        "model_path": "standin-7b",
        "unit_text": "[Service]\n",
        "host_name": "ct200",
        "vars_prefix": "sglang_fleet_",
        "check_gpus": True,
    }
    return inst.FleetSpec(**{**base, **kw})  # type: ignore[arg-type]


def observed(units: dict[int, tuple[str, str]] | None = None, **kw: object) -> obs.Observed:
    states = {
        i: obs.UnitState(index=i, active=a, pid=100 + i, digest=d) for i, (a, d) in (units or {}).items()
    }
    return obs.Observed(existing=tuple(sorted(states)), units=states, **kw)  # type: ignore[arg-type]


def test_gpu_lists_give_cuda_visible_devices_and_tp_size_and_models_per_instance() -> None:
    fleet = spec(
        gpu_ids=((0, 1), (2, 3), 4),
        instance_models=(None, inst.InstanceModel(model_path="drafter-1b", served_model_name="drafter")),
        api_key="k3y",
        environment={"B": 'say "hi"', "A": "1"},
    )
    assert inst.problems(fleet, EIGHT) == []
    a, b, c = inst.layout(fleet, EIGHT, "flashinfer")
    body = a.env_body()
    # CUDA's default order is FASTEST_FIRST; PCI_BUS_ID makes the ids nvidia-smi's, as status reads them.
    assert body.startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_VISIBLE_DEVICES=0,1\n")
    assert 'A="1"\nB="say \\"hi\\""\n' in body
    assert "--tp-size 2 --attention-backend flashinfer" in body and "--port 30000" in body
    assert "--api-key k3y" in body
    assert b.model_path == "drafter-1b" and b.expected_model == "drafter" and b.gpus == (2, 3)
    assert c.gpus == (4,) and "--tp-size" not in c.args and c.model_path == "standin-7b"
    assert c.env_text("abc").endswith("SGLANG_FLEET_DIGEST=abc\n")


@pytest.mark.parametrize(
    ("kw", "gpus", "message"),
    [
        (
            {"instances": 9},
            EIGHT,
            "sglang_fleet_instances is 9 but ct200 has 8 GPU(s) (nvidia-smi found: True)",
        ),
        (
            {"instances": 8},
            NONE,
            "sglang_fleet_instances is 8 but ct200 has 0 GPU(s) (nvidia-smi found: False)",
        ),
        ({}, NONE, "sglang_fleet_instances is not set and ct200 has no GPU"),
        (
            {"instances": 8, "gpu_ids": (0, 1, 2, 3, 4, 5, 6, 6)},
            EIGHT,
            "two instances on one GPU: instances 6 and 7 on GPU 6",
        ),
        ({"gpu_ids": ((0, 1), (1, 2))}, EIGHT, "two instances on one GPU: instances 0 and 1 on GPU 1"),
        ({"gpu_ids": ((6, 7), (8, 9))}, EIGHT, "names GPUs that ct200 does not have (it has 8): [8, 9]"),
        (
            {"model_path": "/no/such/model"},
            EIGHT,
            "sglang_fleet_model_path /no/such/model does not exist on ct200",
        ),
        ({"extra_args": ("--a b",)}, EIGHT, "must be one word without whitespace"),
        ({"attention_backend": "fa9"}, EIGHT, "sglang_fleet_attention_backend 'fa9' is not an SGLang 0.5.12"),
        ({"instances": 2, "port_base": 65535}, EIGHT, "must lie within 1024..65535"),
        (
            {"environment": {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}},
            EIGHT,
            'sglang_fleet_environment sets ["CUDA_DEVICE_ORDER"]: the fleet writes these itself',
        ),
    ],
)
def test_bad_configuration_is_refused_naming_the_variable(
    kw: dict, gpus: inst.GpuInventory, message: str
) -> None:
    assert message in " ".join(inst.problems(spec(**kw), gpus))


def test_count_follows_gpu_ids_then_the_gpus_found() -> None:
    assert inst.instance_count(spec(), EIGHT) == 8
    assert inst.instance_count(spec(gpu_ids=((0, 1), (2, 3))), EIGHT) == 2
    assert inst.instance_count(spec(instances=3), EIGHT) == 3
    assert inst.problems(spec(instances=8, check_gpus=False), NONE) == []


def test_plan_starts_rolls_and_retires() -> None:
    fleet = spec(instances=3)
    first = plan_mod.plan(fleet, EIGHT, observed())
    assert (first.to_start, first.to_roll, first.to_retire) == ([0, 1, 2], [], ())
    want = [p.digest for p in first.instances]
    # 0 runs the planned configuration, 1 another one, 2 crashed; 3 and 4 are beyond the count.
    now = observed(
        {
            0: ("active", want[0]),
            1: ("active", "old"),
            2: ("failed", ""),
            3: ("active", "x"),
            4: ("inactive", ""),
        }
    )
    p = plan_mod.plan(fleet, EIGHT, now)
    assert (p.to_start, p.to_roll, p.to_retire) == ([2], [1], (3, 4))
    assert p.as_dict("127.0.0.1")["urls"] == [
        "http://127.0.0.1:30000",
        "http://127.0.0.1:30001",
        "http://127.0.0.1:30002",
    ]


def test_digest_covers_what_the_server_runs() -> None:
    fleet = spec(instances=1, model_path="/srv/models/m")
    base = obs.RuntimeInputs(venv="v1", common_env="CUDA_HOME=/opt/cuda\n", models={"/srv/models/m": "m1"})
    digest = plan_mod.plan(fleet, EIGHT, observed(runtime=base)).instances[0].digest

    def with_(**kw: object) -> str:
        runtime = base.model_copy(update=kw)
        return plan_mod.plan(fleet, EIGHT, observed(runtime=runtime)).instances[0].digest

    assert with_() == digest
    assert with_(venv="v2") != digest  # a new sglang or torch in the venv
    assert with_(common_env="CUDA_HOME=/opt/cuda-13.3\n") != digest
    assert with_(models={"/srv/models/m": "m2"}) != digest  # a new snapshot of the model
    assert (
        plan_mod.plan(fleet.model_copy(update={"unit_text": "x"}), EIGHT, observed(runtime=base))
        .instances[0]
        .digest
        != digest
    )
    assert (
        plan_mod.plan(fleet.model_copy(update={"context_length": 8}), EIGHT, observed(runtime=base))
        .instances[0]
        .digest
        != digest
    )


def test_a_fleet_written_before_the_pci_bus_order_rolls_once() -> None:
    # An environment file without CUDA_DEVICE_ORDER (written by an earlier sglfleet) is another
    # configuration: its instances roll once, then the plan is quiet.
    fleet = spec(instances=2)
    runtime = observed().runtime

    class Before(inst.InstanceSpec):
        def env_body(self) -> str:
            return super().env_body().replace("CUDA_DEVICE_ORDER=PCI_BUS_ID\n", "")

    planned = plan_mod.plan(fleet, EIGHT, observed()).instances
    old = [plan_mod.digest(Before(**p.spec.model_dump()), fleet.unit_text, runtime) for p in planned]
    assert old[0] != planned[0].digest
    before = plan_mod.plan(fleet, EIGHT, observed({0: ("active", old[0]), 1: ("active", old[1])}))
    assert before.to_roll == [0, 1]
    after = plan_mod.plan(fleet, EIGHT, observed({i: ("active", p.digest) for i, p in enumerate(planned)}))
    assert (after.to_start, after.to_roll) == ([], [])


def test_the_venv_fingerprint_follows_a_version_bump(tmp_path: Path) -> None:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    (site / "sglang-0.5.12.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.12.dist-info/RECORD").write_text("sglang/__init__.py,sha256=a,1\n")
    (site / "torch-2.11.0.dist-info").mkdir()
    (site / "torch-2.11.0.dist-info/RECORD").write_text("torch/__init__.py,sha256=b,1\n")
    before = obs.runtime_inputs(tmp_path / "venv", tmp_path / "common.env", [])
    assert (before.version_of("sglang"), before.version_of("torch")) == ("0.5.12", "2.11.0")
    assert not before.common_env_exists
    (site / "sglang-0.5.12.dist-info").rename(site / "sglang-0.5.13.dist-info")
    after = obs.runtime_inputs(tmp_path / "venv", tmp_path / "common.env", [])
    assert after.version_of("sglang") == "0.5.13" and after.venv != before.venv


def test_the_backend_is_the_sglang_phases_decision_unless_the_inventory_says(tmp_path: Path) -> None:
    env = tmp_path / "common.env"
    env.write_text("# Managed\nCUDA_HOME=/opt/cuda-13.2\nSGLANG_ATTENTION_BACKEND=fa3\n")
    runtime = obs.runtime_inputs(tmp_path, env, [])
    assert runtime.recorded_backend == "fa3"
    fleet = spec(instances=1, common_env_file=str(env))
    assert plan_mod.resolve_backend(fleet, runtime)[0] == "fa3"
    assert (
        plan_mod.resolve_backend(fleet.model_copy(update={"attention_backend": "triton"}), runtime)[0]
        == "triton"
    )
    assert plan_mod.resolve_backend(fleet.model_copy(update={"attention_backend": None}), runtime)[0] is None
    assert plan_mod.resolve_backend(fleet, obs.RuntimeInputs())[0] is None
    assert "--attention-backend fa3" in " ".join(
        plan_mod.plan(fleet, EIGHT, observed(runtime=runtime)).instances[0].spec.args
    )


def test_listeners_name_who_holds_a_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        (found,) = obs.listeners([port])
    assert found.port == port and not found.ours
    assert found.describe().startswith(f"{port}: pid {os.getpid()} (")


def test_a_socket_no_process_here_holds_belongs_to_the_host(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    row = (
        "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
    )
    (tmp_path / "net/tcp").write_text(header + row)
    (found,) = obs.listeners([30000], proc=tmp_path)
    assert found.describe() == "30000: a process this host cannot see (the host or another container)"


def test_unit_states_read_systemd_and_the_process_digest(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77/environ").write_bytes(b"A=1\0SGLANG_FLEET_DIGEST=d1\0")
    out = (
        "Id=sglang@0.service\nActiveState=active\nMainPID=77\nUnitFileState=enabled\n\n"
        "Id=sglang@1.service\nActiveState=inactive\nMainPID=0\nUnitFileState=disabled\n"
    )
    states = obs.unit_states([0, 1], systemctl=lambda argv: out, proc=tmp_path)
    assert states[0] == obs.UnitState(index=0, active="active", pid=77, enabled="enabled", digest="d1")
    assert states[1].active == "inactive" and states[1].digest == ""


def _module_args(tmp_path: Path, **kw: object) -> dict:
    return {
        "state": "present",
        "instances": 2,
        "gpu_ids": [[0, 1], 2],
        "check_gpus": False,
        "model_path": "standin-7b",
        "api_key": "s3cret-key",
        "config_dir": str(tmp_path / "etc"),
        "common_env_file": str(tmp_path / "common.env"),
        "venv": str(tmp_path / "venv"),
        "port_base": 39000,
        "unit_text": "[Service]\n",
        "vars_prefix": "sglang_fleet_",
        **kw,
    }


def test_module_writes_0600_env_files_truthfully_in_check_and_diff_mode(tmp_path: Path) -> None:
    (tmp_path / "common.env").write_text("SGLANG_ATTENTION_BACKEND=flashinfer\n")
    check = run_module("sglang_instances", _module_args(tmp_path), tmp_path, check=True, diff=True)
    assert check["changed"] and not (tmp_path / "etc").exists()
    assert "s3cret-key" not in str(check) and "********" in check["diff"][0]["after"]
    assert check["to_start"] == [0, 1] and check["attention_backend"] == "flashinfer"

    run = run_module("sglang_instances", _module_args(tmp_path), tmp_path)
    assert run["changed"] and run["written"] == [
        str(tmp_path / "etc/instance-0.env"),
        str(tmp_path / "etc/instance-1.env"),
    ]
    env0 = (tmp_path / "etc/instance-0.env").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in env0 and "--tp-size 2" in env0 and "--api-key s3cret-key" in env0
    assert stat.S_IMODE((tmp_path / "etc/instance-0.env").stat().st_mode) == 0o600
    assert run_module("sglang_instances", _module_args(tmp_path), tmp_path, check=True)["changed"] is False
    assert run_module("sglang_instances", _module_args(tmp_path), tmp_path)["changed"] is False

    # A file that existed with another mode is made 0600 (and that is a change).
    (tmp_path / "etc/instance-1.env").chmod(0o644)
    again = run_module("sglang_instances", _module_args(tmp_path), tmp_path)
    assert again["written"] == [str(tmp_path / "etc/instance-1.env")]
    assert stat.S_IMODE((tmp_path / "etc/instance-1.env").stat().st_mode) == 0o600


def test_module_refuses_overlapping_gpus_before_writing(tmp_path: Path) -> None:
    result = run_module("sglang_instances", _module_args(tmp_path, gpu_ids=[[0, 1], [1]]), tmp_path)
    assert result["failed"]
    assert (
        "sglang_fleet_gpu_ids [[0, 1], 1]" in result["msg"] and "instances 0 and 1 on GPU 1" in result["msg"]
    )
    assert not (tmp_path / "etc").exists()


def test_module_documentation_renders() -> None:
    doc = module_doc("sglang_instances")
    assert_examples_use_documented_options("sglang_instances", doc)


def _library_module(name: str) -> dict[str, object]:
    """library/<name>.py's globals, loaded as Ansible loads it (its module_utils found), main() not run."""
    import runpy

    import ansible.module_utils
    from support.module_runner import LIBRARY, MODULE_UTILS

    if str(MODULE_UTILS) not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(MODULE_UTILS))
    return runpy.run_path(str(LIBRARY / f"{name}.py"), run_name="probe")


def test_each_fleetspec_field_is_the_module_option_of_its_name_with_the_models_default() -> None:
    """FleetSpec's fields are written once: sglang_instances passes each option of a field's name (a new
    field without its option fails here), and its defaults build the model's defaults."""
    module = _library_module("sglang_instances")
    options = module["ARGUMENT_SPEC"]
    fields = set(inst.FleetSpec.model_fields)
    assert set(options) - fields == set(module["MODULE_ONLY"]), (
        "an option that is neither a field nor the module's"
    )
    assert fields <= set(options), f"fields without an option: {sorted(fields - set(options))}"
    assert set(module_doc("sglang_instances")["doc"]["options"]) == set(options)
    defaults = {name: option.get("default") for name, option in options.items()}
    assert module["fleet_spec"](defaults) == inst.FleetSpec(environment={})
    given = dict(defaults, gpu_ids=[[0, 1], 2], environment={"NCCL_DEBUG": 1}, attention_backend="none")
    built = module["fleet_spec"](given)
    assert (built.gpu_ids, built.environment, built.attention_backend) == (
        ((0, 1), 2),
        {"NCCL_DEBUG": "1"},
        None,
    )


def test_the_backend_lists_are_sglang_0_5_12s() -> None:
    from sglfleet_testing.standin.cli import ATTENTION_BACKENDS as STANDIN

    from sglfleet.fleet import _backend

    assert inst.ATTENTION_BACKENDS is _backend.ATTENTION_BACKENDS
    assert sorted(STANDIN) == sorted(_backend.ATTENTION_BACKENDS)


def test_existing_instances_come_from_systemd_enablement_and_env_files(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/instance-9.env").write_text("")
    (tmp_path / "etc/common.env").write_text("")
    (tmp_path / "systemd/multi-user.target.wants").mkdir(parents=True)
    (tmp_path / "systemd/multi-user.target.wants/sglang@7.service").touch()
    listed = "sglang@0.service loaded active running SGLang server, instance 0\nsglang@x.service\n"
    found = obs.existing_instances(tmp_path / "etc", lambda argv: listed, etc_systemd=tmp_path / "systemd")
    assert found == [0, 7, 9]


def test_a_launcher_gets_the_key_from_the_environment_file_not_the_arguments() -> None:
    fleet = spec(instances=1, api_key='k"3y', api_key_variable="SGLANG_FLEET_API_KEY")
    (one,) = inst.layout(fleet, EIGHT, None)
    assert "--api-key" not in one.args
    assert one.env_body().endswith('SGLANG_FLEET_API_KEY="k\\"3y"\n')
    assert "--api-key k" in inst.layout(spec(instances=1, api_key="k"), EIGHT, None)[0].env_body()
