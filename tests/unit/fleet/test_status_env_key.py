"""`sglfleet status` finds the API key where the sglang_fleet role now writes it: SGLANG_FLEET_API_KEY
in the instance's 0600 environment file (read by sglfleet.launch), no longer `--api-key` in SGLANG_ARGS."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglfleet.fleet import layout_from_env_dir


def _env(path: Path, i: int, extra: str) -> None:
    path.write_text(
        f"CUDA_VISIBLE_DEVICES={i}\nSGLANG_FLEET_PORT={30000 + i}\n"
        f'SGLANG_ARGS="--model-path m --port {30000 + i}"\n{extra}SGLANG_FLEET_DIGEST=00\n'
    )


def test_the_key_comes_from_sglang_fleet_api_key(tmp_path: Path) -> None:
    for i in range(2):
        _env(tmp_path / f"instance-{i}.env", i, 'SGLANG_FLEET_API_KEY="k \\"quoted\\""\n')
    assert layout_from_env_dir(tmp_path).api_key == 'k "quoted"'


def test_no_key_anywhere_is_none(tmp_path: Path) -> None:
    _env(tmp_path / "instance-0.env", 0, "")
    assert layout_from_env_dir(tmp_path).api_key is None


def test_the_env_file_is_read_as_systemd_reads_it(tmp_path: Path) -> None:
    # systemd ignores `export NAME=` (no variable name), so the instance never got this key
    _env(tmp_path / "instance-0.env", 0, "export SGLANG_FLEET_API_KEY=k\n")
    assert layout_from_env_dir(tmp_path).api_key is None
    _env(tmp_path / "instance-0.env", 0, 'SGLANG_FLEET_API_KEY="open\n')
    with pytest.raises(ValueError, match=r"instance-0.env:4: the quote opened here is not closed"):
        layout_from_env_dir(tmp_path)
