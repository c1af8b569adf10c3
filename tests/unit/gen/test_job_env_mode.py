"""generation_job's environment file holds the API key: 0600 even where a file with another mode was."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sglfleet.gen import JobSpec, write_job_env


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o600, 0o400])
def test_an_existing_env_file_becomes_0600_before_the_key_is_written(tmp_path: Path, mode: int) -> None:
    options = {"name": "j", "input": tmp_path / "in.jsonl", "output": tmp_path / "out", "api_key": "s3cret"}
    spec = JobSpec.from_options(options, env_dir=tmp_path / "env")
    spec.env_dir.mkdir()
    spec.env_file.write_text("OLD=1\n")
    spec.env_file.chmod(mode | stat.S_IWUSR)  # writable by its owner, as root's files are
    write_job_env(spec)
    assert stat.S_IMODE(spec.env_file.stat().st_mode) == 0o600
    assert spec.env_file.read_text() == 'SGLFLEET_API_KEY="s3cret"\n'
    assert list(spec.env_dir.iterdir()) == [spec.env_file]  # no temporary file left behind
