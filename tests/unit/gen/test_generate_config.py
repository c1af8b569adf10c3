"""`sglfleet generate` refuses bad arguments before it reads the input or sends anything: every
problem at once, each naming the option and what is wrong, in the order of the options."""

from __future__ import annotations

from pathlib import Path

from sglfleet.gen import GenerateConfig, GenParams, check_config


def test_every_problem_is_listed_in_the_order_of_the_options(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    config = GenerateConfig(
        input=inp,
        output=tmp_path / "out.jsonl",
        endpoints=["http://h:30000", "http://h:30000/", "ftp://x"],
        concurrency=0,
        dispatch="random",
        max_retries=-1,
        request_timeout=0,
        max_resends=-1,
        metrics_port=70000,
        metrics_linger=-1,
        params=GenParams(temperature=float("nan"), top_p=float("inf"), max_tokens=0),
    )
    assert check_config(config) == [
        "endpoint 2: http://h:30000/ is listed twice",
        "endpoint 3: 'ftp://x' is not an http(s)://HOST:PORT URL (e.g. http://10.0.0.5:30000)",
        "--concurrency must be at least 1",
        "--dispatch must be one of least-loaded, prefix, not 'random'",
        "--max-retries must be 0 or more",
        "--request-timeout must be positive",
        "--max-resends must be 0 or more",
        "--metrics-port 70000 is not a TCP port (0-65535; 0: any free one)",
        "--metrics-linger must be 0 or more",
        "--temperature nan is not a finite number",
        "--top-p inf is not a finite number",
        "--max-tokens 0 must be at least 1",
    ]


def test_a_good_config_has_no_problem(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    config = GenerateConfig(input=inp, output=tmp_path / "new" / "out.jsonl", endpoints=["http://h:1"])
    assert check_config(config) == []


def test_the_input_and_output_paths_are_checked(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    (tmp_path / "file").write_text("x")
    (tmp_path / "taken.jsonl.manifest.json").mkdir()

    def problems(input_path: Path, output: Path, endpoints: tuple[str, ...] = ("http://h:1",)) -> list[str]:
        return check_config(GenerateConfig(input=input_path, output=output, endpoints=list(endpoints)))

    assert problems(tmp_path / "missing.jsonl", tmp_path, ()) == [
        "no endpoint: give --endpoint URL (or --endpoints-file)",
        f"input {tmp_path / 'missing.jsonl'} is not a file",
        f"output {tmp_path} is a directory: give a file path for --output",
    ]
    out = tmp_path / "file" / "sub" / "out.jsonl"
    assert problems(inp, out) == [f"output {out}: cannot use it: Not a directory"]
    assert problems(inp, tmp_path / "taken.jsonl") == [
        f"the output's manifest {tmp_path / 'taken.jsonl.manifest.json'} is a directory: "
        "give a file path for --output"
    ]
    assert problems(inp, inp) == [
        f"output {inp} is the input {inp}: refusing to overwrite an input; choose another path"
    ]
