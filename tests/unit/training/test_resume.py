"""sglfleet.training._resume: the decisions of phase training_resume, on real files and a fake systemd."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from support.module_runner import run_module

from sglfleet.fleet import GpuFacts, combine, parse_compute_apps, parse_gpus
from sglfleet.training import (
    DROPIN_NAME,
    OLD_DROPIN_NAMES,
    ResumeError,
    dataset_state,
    environment_problems,
    file_digest,
    fleet_plan,
    gpus_not_free,
    install_dataset,
    launch_plan,
    loaded_rows,
    look,
)

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 3, 16, 1, 2, tzinfo=UTC)
NEW = b'{"id": 1}\n{"id": 2}\n\n{"id": 3}'  # three rows, the last without a newline
OLD = b'{"id": "old"}\n'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_digest_counts_non_empty_rows_across_chunk_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [b'{"text": "%d"}' % i for i in range(200_000)]
    data = b"\n".join(rows) + b"\n\n"
    path.write_bytes(data)
    assert file_digest(path) == (sha(data), 200_000)


def test_the_set_goes_in_and_what_was_there_is_kept_aside(tmp_path: Path) -> None:
    path, staged = tmp_path / "train.jsonl", tmp_path / "train.jsonl.sglfleet-incoming"
    path.write_bytes(OLD)
    staged.write_bytes(NEW)
    before = dataset_state(path, sha(NEW))
    assert (before.exists, before.matches, before.rows) == (True, False, 1)

    predicted = install_dataset(staged, path, sha(NEW), check_mode=True, now=T0)
    assert predicted.changed and path.read_bytes() == OLD and staged.exists()
    aside = tmp_path / f"train.jsonl.kept-20261203T160102Z-{sha(OLD)[:12]}"
    assert predicted.moved_aside == str(aside)

    done = install_dataset(staged, path, sha(NEW), now=T0)
    assert done.changed and done.moved_aside == str(aside)
    assert path.read_bytes() == NEW and aside.read_bytes() == OLD and not staged.exists()
    assert (done.state.sha256, done.state.rows, done.state.kept_aside) == (sha(NEW), 3, (str(aside),))

    again = install_dataset(staged, path, sha(NEW), now=T0)
    assert not again.changed and again.moved_aside is None


def test_a_staged_copy_with_other_content_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    path, staged = tmp_path / "train.jsonl", tmp_path / "incoming"
    path.write_bytes(OLD)
    staged.write_bytes(NEW[:-3])  # a copy cut short
    with pytest.raises(ResumeError, match=r"incoming: sha256 .* is not the merged set's .* left as it was"):
        install_dataset(staged, path, sha(NEW))
    assert path.read_bytes() == OLD and list(tmp_path.glob("*.kept-*")) == []


def test_a_missing_place_gets_the_set_without_keeping_anything_aside(tmp_path: Path) -> None:
    path, staged = tmp_path / "train.jsonl", tmp_path / "incoming"
    staged.write_bytes(NEW)
    done = install_dataset(staged, path, sha(NEW))
    assert done.changed and done.moved_aside is None and path.read_bytes() == NEW


def test_the_module_moves_the_set_in_and_says_so_in_check_mode_first(tmp_path: Path) -> None:
    path, staged = tmp_path / "train.jsonl", tmp_path / "train.jsonl.incoming"
    path.write_bytes(OLD)
    staged.write_bytes(NEW)
    args = {"path": str(path), "sha256": sha(NEW), "staged": str(staged), "state": "present"}
    check = run_module("training_dataset", args, tmp_path, check=True, diff=True)
    assert check["changed"] and check["moved_aside"].startswith(f"{path}.kept-")
    assert check["diff"]["before"] == {"sha256": sha(OLD), "rows": 1} and path.read_bytes() == OLD
    real = run_module("training_dataset", args, tmp_path)
    assert real["changed"] and (real["rows"], real["matches"]) == (3, True)
    observed = run_module("training_dataset", {"path": str(path), "sha256": sha(NEW)}, tmp_path)
    assert observed["changed"] is False and observed["matches"] is True


class Systemd:
    """`systemctl` as the fleet modules ask it: list-units and show, from a table of unit states."""

    def __init__(
        self,
        units: dict[str, tuple[str, str]],
        generation: Sequence[str] = (),
        env_files: dict[str, Sequence[str]] | None = None,
    ) -> None:
        self.units = units  # name -> (ActiveState, UnitFileState)
        self.generation = list(generation)
        self.env_files = env_files or {}  # name -> EnvironmentFile= paths

    def __call__(self, argv: Sequence[str]) -> str:
        if argv[1] == "list-units":
            if argv[-1].startswith("sglfleet-gen-"):
                return "".join(f"{u} loaded active running sglfleet generate\n" for u in self.generation)
            return "".join(f"{u} loaded {s[0]} running x\n" for u, s in self.units.items())
        if "--property=EnvironmentFiles" in argv:
            # systemctl-show.c: one "EnvironmentFiles=<path> (ignore_errors=yes|no)" line per file
            files = self.env_files.get(argv[-1], ())
            return "".join(f"EnvironmentFiles={p} (ignore_errors=no)\n" for p in files)
        blocks = []
        for name in (a for a in argv[2:] if not a.startswith("--")):
            active, enabled = self.units.get(name, ("inactive", ""))
            load = "loaded" if name in self.units else "not-found"
            blocks.append(
                f"Id={name}\nLoadState={load}\nActiveState={active}\nMainPID=0\nUnitFileState={enabled}\n"
            )
        return "\n".join(blocks)


def _fleet(tmp_path: Path, gpu_sets: Sequence[str]) -> Path:
    config = tmp_path / "sglang"
    config.mkdir()
    for i, devices in enumerate(gpu_sets):
        (config / f"instance-{i}.env").write_text(
            f"CUDA_VISIBLE_DEVICES={devices}\nSGLANG_FLEET_PORT={30000 + i}\n"
            f'SGLANG_ARGS="--port {30000 + i}"\n'
        )
    return config


def test_the_fleet_scales_down_to_the_kept_instances(tmp_path: Path) -> None:
    config = _fleet(tmp_path, ["0", "1", "2,3"])
    systemd = Systemd({
        "sglang@0.service": ("active", "enabled"),
        "sglang@1.service": ("active", "enabled"),
        "sglang@2.service": ("inactive", "enabled"),
    })  # fmt: skip
    plan = fleet_plan(config, [0], systemctl=systemd, proc=tmp_path)
    assert (plan.to_stop, plan.to_disable, plan.keep, plan.kept_gpus) == ((1,), (1, 2), (0,), (0,))
    assert plan.as_dict()["stopped"] == [1, 2] and plan.refused == ""
    # the stopped instances' ports: the router's worker URLs (roles/training_resume/tasks/drain.yml)
    assert plan.as_dict()["stopped_ports"] == [30001, 30002]
    keep_tp = fleet_plan(config, [2], systemctl=systemd, proc=tmp_path)
    assert keep_tp.to_stop == (0, 1) and keep_tp.kept_gpus == (2, 3)
    with pytest.raises(ResumeError, match=r"training_resume_keep_instances: \[5\] are not instances"):
        fleet_plan(config, [5], systemctl=systemd, proc=tmp_path)


def test_a_stop_under_a_running_generation_job_is_refused_unless_allowed(tmp_path: Path) -> None:
    config = _fleet(tmp_path, ["0", "1"])
    systemd = Systemd(
        {"sglang@0.service": ("active", "enabled"), "sglang@1.service": ("active", "enabled")},
        generation=["sglfleet-gen-regen.service"],
    )
    plan = fleet_plan(config, [], systemctl=systemd, proc=tmp_path)
    assert plan.generation_jobs == ("sglfleet-gen-regen.service",)
    assert plan.refused.startswith(
        "a generation job is still running on the fleet (sglfleet-gen-regen.service)"
    )
    assert fleet_plan(config, [], allow_running_jobs=True, systemctl=systemd, proc=tmp_path).refused == ""
    # Nothing to stop (every running instance is kept): nothing to refuse.
    assert fleet_plan(config, [0, 1], systemctl=systemd, proc=tmp_path).refused == ""


def test_a_hand_started_generate_counts_as_a_running_job(tmp_path: Path) -> None:
    config = _fleet(tmp_path, ["0"])
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cmdline").write_bytes(b"/opt/sglfleet/venv/bin/python\0-m\0sglfleet\0generate\0-i\0x\0")
    (proc / "4242" / "stat").write_text("4242 (python) S 1 0")
    (proc / "4243").mkdir()
    (proc / "4243" / "cmdline").write_bytes(b"vim\0notes-on-sglfleet generate.md\0")
    (proc / "4243" / "stat").write_text("4243 (vim) S 1 0")
    systemd = Systemd({"sglang@0.service": ("active", "enabled")})
    plan = fleet_plan(config, [], systemctl=systemd, proc=proc)
    assert len(plan.generation_jobs) == 1 and plan.generation_jobs[0].startswith("process 4242 (")


def _facts(used: Sequence[int], pids: dict[int, int]) -> GpuFacts:
    rows = "\n".join(f"{i}, GPU-{i}, RTX PRO 6000, {u}, 97887, 12.0, 580.95.05" for i, u in enumerate(used))
    apps = "\n".join(f"{pid}, GPU-{gpu}, 91000, python3" for pid, gpu in pids.items())
    return combine(parse_gpus(rows), parse_compute_apps(apps), "/usr/bin/nvidia-smi")


def test_the_freed_gpus_must_hold_no_process_and_little_memory() -> None:
    facts = _facts([91000, 3, 2048, 0], {4242: 0, 4343: 3})
    assert gpus_not_free(facts, kept_gpus=[0], max_used_mib=1024) == [
        "GPU 2: 2048 MiB used (more than 1024 MiB)",
        "GPU 3: compute process 4343 (python3)",
    ]
    assert gpus_not_free(_facts([0, 5], {}), kept_gpus=[], max_used_mib=1024) == []


def test_units_get_a_drop_in_with_the_set_and_the_checkpoint() -> None:
    systemd = Systemd({"train.service": ("inactive", "enabled")})
    plan = launch_plan(
        units=["train"],
        environment={"TRAIN_DATA": "{dataset}", "RESUME_FROM": "{checkpoint}", "NOTE": 'a "q" 100%'},
        command="",
        dataset="/data/train.jsonl",
        checkpoint="/ckpt/latest",
        systemctl=systemd,
    )
    assert plan.mode == "unit" and plan.units == ("train.service",) and plan.to_start == ["train.service"]
    assert plan.dropin_content.splitlines()[1:] == [
        "[Service]",
        'Environment="NOTE=a \\"q\\" 100%%"',
        'Environment="RESUME_FROM=/ckpt/latest"',
        'Environment="TRAIN_DATA=/data/train.jsonl"',
    ]
    with pytest.raises(ResumeError, match=r"training units \['gone'\] do not exist"):
        launch_plan(units=["gone"], environment={"X": "{dataset}"}, command="", dataset="d",
                           checkpoint="c", systemctl=systemd)  # fmt: skip
    with pytest.raises(ResumeError, match=r"training_resume_environment is empty"):
        launch_plan(units=["train"], environment={}, command="", dataset="d", checkpoint="c",
                           systemctl=systemd)  # fmt: skip


def test_an_environment_file_that_sets_a_planned_name_is_refused(tmp_path: Path) -> None:
    # systemd.exec(5): "Settings from these files override settings made with Environment=", so the
    # drop-in's TRAIN_DATA would never reach the job: refuse, naming the file, the line and the name.
    env_file = tmp_path / "drafter.env"
    env_file.write_text("# defaults\nWANDB_PROJECT=drafter\nTRAIN_DATA=/data/old.jsonl\n")
    other = tmp_path / "other.env"
    other.write_text("OMP_NUM_THREADS=8\n")
    systemd = Systemd({"train.service": ("inactive", "enabled")}, env_files={"train.service": [str(other)]})
    args = {"units": ["train"], "command": "", "dataset": "/d.jsonl", "checkpoint": "/c"}
    env = {"TRAIN_DATA": "{dataset}", "RESUME_FROM": "{checkpoint}"}
    assert launch_plan(environment=env, systemctl=systemd, **args).mode == "unit"
    systemd.env_files["train.service"] = [str(other), str(env_file), str(tmp_path / "absent.env")]
    with pytest.raises(ResumeError) as refused:
        launch_plan(environment=env, systemctl=systemd, **args)
    assert f"train.service: {env_file}:3 sets TRAIN_DATA" in str(refused.value)
    assert "EnvironmentFile= overrides the drop-in's Environment=" in str(refused.value)
    assert "RESUME_FROM" not in str(refused.value) and "WANDB_PROJECT" not in str(refused.value)


def test_a_value_with_a_control_character_is_refused_before_any_drop_in(tmp_path: Path) -> None:
    # A newline would split the drop-in's Environment= line, and `systemctl show` C-escapes a tab, so the
    # read-back could not match it: refused, naming the variable, before anything is written.
    systemd = Systemd({"train.service": ("inactive", "enabled")})
    args = {"units": ["train"], "command": "", "dataset": "/d.jsonl", "checkpoint": "/c"}
    for value in ("/data/a\nb", "x\ty", "{dataset}\r"):
        with pytest.raises(ResumeError) as refused:
            launch_plan(environment={"TRAIN_DATA": value}, systemctl=systemd, **args)
        assert "training_resume_environment.TRAIN_DATA" in str(refused.value)
        assert "control character" in str(refused.value)
    plan = launch_plan(environment={"TRAIN_DATA": "{dataset} é ünïcode"}, systemctl=systemd, **args)
    assert plan.mode == "unit"


def test_an_environment_file_systemd_refuses_is_named_in_the_refusal(tmp_path: Path) -> None:
    # env-file.c check_utf8ness_and_warn: a value that is not UTF-8 fails the whole file, so the unit (or
    # the kept instance) would not start; the modules report a ResumeError, so that is what comes back.
    bad = tmp_path / "bad.env"
    bad.write_bytes(b"TRAIN_DATA=caf\xe9\n")
    systemd = Systemd({"train.service": ("inactive", "enabled")}, env_files={"train.service": [str(bad)]})
    args = {"units": ["train"], "command": "", "dataset": "/d.jsonl", "checkpoint": "/c"}
    with pytest.raises(ResumeError, match=rf"train.service cannot start: {bad}:1: invalid UTF-8"):
        launch_plan(environment={"TRAIN_DATA": "{dataset}"}, systemctl=systemd, **args)
    config = _fleet(tmp_path, ["0", "1"])
    (config / "instance-0.env").write_bytes(b"CUDA_VISIBLE_DEVICES=0\xff\n")
    fleet = Systemd({"sglang@0.service": ("active", "enabled"), "sglang@1.service": ("active", "enabled")})
    with pytest.raises(ResumeError, match=r"instance 0 cannot start: .*instance-0.env:1: invalid UTF-8"):
        fleet_plan(config, [0], systemctl=fleet, proc=tmp_path)


def test_a_bare_process_resumes_as_a_transient_unit_with_quoted_paths() -> None:
    systemd = Systemd({})
    plan = launch_plan(
        units=[],
        environment={"WANDB_RUN": "drafter"},
        command="torchrun --nproc-per-node 8 train.py --data {dataset} --resume {checkpoint}",
        dataset="/data/grown set.jsonl",
        checkpoint="/ckpt/step 9000",
        systemctl=systemd,
    )
    assert plan.mode == "command" and plan.to_start == ["sglfleet-training.service"]
    assert plan.argv[:4] == (
        "systemd-run", "--unit=sglfleet-training.service", "--property=KillSignal=SIGTERM",
        "--property=KillMode=mixed",
    )  # fmt: skip
    assert "--collect" in plan.argv[: plan.argv.index("--")]
    assert "--setenv=WANDB_RUN=drafter" in plan.argv
    words = list(plan.argv[plan.argv.index("--") + 1 :])
    assert words == shlex.split(plan.command)
    assert words[-4:] == ["--data", "/data/grown set.jsonl", "--resume", "/ckpt/step 9000"]
    # systemd expands $VAR in a command line from the unit's environment; a $ in a path stays literal as $$,
    # and the user's own $VAR in the template is left for systemd to expand.
    dollar = launch_plan(
        units=[], environment={}, command="train --data {dataset} --resume {checkpoint} --run $RUN",
        dataset="/data/$HOME/set.jsonl", checkpoint="/ckpt/${STEP}", systemctl=systemd,
    )  # fmt: skip
    assert list(dollar.argv[dollar.argv.index("--") + 1 :]) == [
        "train", "--data", "/data/$$HOME/set.jsonl", "--resume", "/ckpt/$${STEP}", "--run", "$RUN",
    ]  # fmt: skip
    with pytest.raises(ResumeError, match=r"training_resume_command: .* uses \['data'\]"):
        launch_plan(units=[], environment={}, command="train --data {data}", dataset="d",
                           checkpoint="c", systemctl=systemd)  # fmt: skip
    # No unit and no command (phase training_stop found no job): nothing to start.
    nothing = launch_plan(units=[], environment={}, command=" ", dataset="d", checkpoint="c",
                                 systemctl=systemd)  # fmt: skip
    assert nothing.mode == "none" and nothing.to_start == []


def test_loaded_rows_takes_the_last_match_and_its_number() -> None:
    log = (
        "trainer: loaded 902,144 rows from /old\nstep 1\ntrainer: loaded 1,093,722 rows from /data/t.jsonl\n"
    )
    assert loaded_rows(log, r"loaded ([0-9,]+) rows from") == 1_093_722
    assert loaded_rows(log, r"loaded .* rows") == -1
    assert loaded_rows("step 1\n", r"loaded ([0-9]+) rows") is None
    with pytest.raises(ResumeError, match=r"training_resume_loaded_pattern"):
        loaded_rows(log, "loaded (")


def test_the_look_counts_gpu_memory_of_the_units_processes_and_reads_this_runs_journal(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    for pid, unit in ((4242, "train.service"), (5151, "sglang@0.service")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    journals: list[Sequence[str]] = []

    def systemctl(argv: Sequence[str]) -> str:
        return "Id=train.service\nActiveState=active\nMainPID=4242\nNRestarts=0\nInvocationID=abc123\n"

    def journal(argv: Sequence[str]) -> str:
        journals.append(argv)
        return "resumed from checkpoint /c at step 7\nloaded 12 rows from /d\n"

    seen = look(
        ["train"], pattern=r"loaded (\d+) rows", gpu_facts=_facts([91000, 91000], {4242: 0, 5151: 1}),
        systemctl=systemctl, journal=journal, proc=proc,
    )  # fmt: skip
    assert (seen.running, seen.main_pids, seen.gpu_processes, seen.gpu_memory_mib) == (
        True, {"train.service": 4242}, (4242,), 91000,
    )  # fmt: skip
    assert seen.loaded_rows == 12 and seen.nvidia_smi_found
    assert journals == [["journalctl", "--no-pager", "--output=cat", "_SYSTEMD_INVOCATION_ID=abc123"]]


def test_the_environment_in_effect_is_read_back_as_systemctl_show_quotes_it() -> None:
    # systemctl show prints each word through shell_maybe_quote(str, 0) (bus-print-properties.c).
    shown = r'Environment=A=1 "B=two words" "C=\$HOME \"q\"" A=3'

    def systemctl(argv: Sequence[str]) -> str:
        assert argv[:3] == ["systemctl", "show", "--property=Id,Environment,DropInPaths"]
        return (
            "Id=train.service\n" + shown + "\nDropInPaths=/etc/systemd/system/train.service.d/zz-x.conf "
            "/etc/systemd/system/train.service.d/zz-z.conf\n"
        )

    # A later assignment wins: a drop-in after ours (zz-z.conf) set A again; D is set nowhere.
    problems = environment_problems(["train"], {"A": "1", "B": "two words", "D": "x"}, systemctl)
    assert problems == [
        "train.service: A='3' (asked for '1'), D unset; drop-ins: "
        "/etc/systemd/system/train.service.d/zz-x.conf /etc/systemd/system/train.service.d/zz-z.conf"
    ]
    assert environment_problems(["train"], {"A": "3", "C": '$HOME "q"'}, systemctl) == []


def test_the_role_names_the_drop_in_the_package_defines() -> None:
    role_vars = yaml.safe_load((REPO / "roles/training_resume/vars/main.yml").read_text())
    assert role_vars["__training_resume_dropin_name"] == DROPIN_NAME
    assert role_vars["__training_resume_old_dropin_names"] == list(OLD_DROPIN_NAMES)
    # Drop-ins apply in file-name order (systemd.unit(5)): ours after `systemctl edit`'s override.conf.
    assert sorted([DROPIN_NAME, "override.conf", "99-local.conf"])[-1] == DROPIN_NAME
    assert launch_plan(
        units=["train"], environment={"X": "{dataset}"}, command="", dataset="d", checkpoint="c",
        systemctl=Systemd({"train.service": ("inactive", "enabled")}),
    ).dropin_name == DROPIN_NAME  # fmt: skip
