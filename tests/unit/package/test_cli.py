"""The `sglfleet` command's face: `--help` of the command and of each subcommand starts without the
package's heavy parts, the flags are the same across subcommands, and defaults are shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglfleet.cli import HELP, SUBCOMMANDS, build_parser, main

# What a `--help` must not import (each costs 0.1-0.5 s of CPU before anything is printed).
HEAVY = ("aiohttp", "rich", "numpy", "pydantic", "matplotlib", "datasketch", "pyarrow", "prometheus_client")
HELPS = [["--help"], *([name, "--help"] for name in SUBCOMMANDS), ["job", "status", "--help"]]
HELPS.append(["job", "report", "--help"])


def _imported_by(argv: list[str]) -> tuple[set[str], str]:
    probe = (
        "import sys\n"
        "from sglfleet.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('\\x00' + ' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    text, _, modules = out.rpartition("\x00")
    return {name.split(".")[0] for name in modules.split()}, text


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    modules, text = _imported_by(argv)
    assert "usage: sglfleet" in text
    assert not modules & set(HEAVY), f"sglfleet {' '.join(argv)} imported {sorted(modules & set(HEAVY))}"


def test_the_probe_sees_a_heavy_import() -> None:
    modules, _ = _imported_by(["health", "--count", "0"])  # runs: imports the HTTP client
    assert "aiohttp" in modules


def test_the_command_lists_every_subcommand_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name, text in HELP.items():
        assert f"{name} {' '.join(text.split())}" in out


def test_each_subcommand_takes_its_help_from_the_list() -> None:
    parser = build_parser()  # every subcommand registered in full
    actions = next(a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in actions._choices_actions}  # type: ignore[attr-defined]
    assert helps == HELP


def test_health_takes_e_endpoint_and_the_old_url(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("-e", "--endpoint", "--url"):
        args = build_parser(["health"]).parse_args(["health", flag, "http://127.0.0.1:1"])
        assert args.url == ["http://127.0.0.1:1"]
    with pytest.raises(SystemExit):
        main(["health", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "-e URL, --endpoint URL, --url URL" in out
    for shown in ("(default: 10.0)", "(default: 2.0)", "(default: 0.0)", "(default: 30000)"):
        assert shown in out


@pytest.mark.parametrize("name", ["mix", "merge"])
def test_mix_and_merge_take_o(name: str) -> None:
    required = {"mix": ["--config", "c.yaml"], "merge": ["--existing", "e", "--results", "r"]}[name]
    args = build_parser([name]).parse_args([name, *required, "-o", "out.jsonl"])
    assert str(args.output) == "out.jsonl"
