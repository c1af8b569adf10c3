"""`sglfleet job status --watch`, the job's timeline (OUT.timeline.jsonl) and `sglfleet job report`:
what a user watching a long job sees, drawn without sleeping (an injected clock, a bounded number of
frames)."""

from __future__ import annotations

import fcntl
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.generate import fleet, run_job, write_batch

from sglfleet.cli import main as cli_main
from sglfleet.cli._watch import watch
from sglfleet.cli.job import status_frame
from sglfleet.gen import (
    TimelineWriter,
    job_status,
    load_manifest,
    load_timeline,
    manifest_path,
    timeline_path,
)
from sglfleet.plot import job_chart, job_series

pytestmark = pytest.mark.timeout(120)
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job of 12 requests run to the end against one stand-in, sampled every 20 ms."""
    tmp = tmp_path_factory.mktemp("job")
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    write_batch(inp, 12)
    with fleet({"standin_decode_tps": 400.0}) as servers:
        outcome = run_job(inp, out, [servers[0].base_url], concurrency=2, timeline_interval=0.02)
    assert outcome.exit_code == 0, outcome.message
    return out


def _console() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=100)


def test_a_complete_job_says_complete_once(finished: Path) -> None:
    lines = job_status(finished).lines()
    assert lines[0] == f"{finished}: complete"  # not "complete (complete)"
    assert lines[1].startswith("  12/12 done (100.0%)")


def test_watch_redraws_until_the_job_stops_running(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / finished.name
    out.write_bytes(finished.read_bytes())
    complete = load_manifest(manifest_path(finished))
    assert complete is not None
    running = complete.model_copy(update={"status": "running"})
    manifest_path(out).write_text(running.model_dump_json())
    holder = out.open("rb")
    fcntl.flock(holder, fcntl.LOCK_EX)  # what a running `sglfleet generate` holds
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the job ends while the watcher waits
        slept.append(seconds)
        manifest_path(out).write_text(complete.model_dump_json())
        holder.close()

    console = _console()
    code = watch(lambda: status_frame(out, False), 2.0, console, sleep=sleep)
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert code == 0 and slept == [2.0]
    assert f"{out}: running" in drawn and f"{out}: complete" in drawn


def test_watch_of_a_running_job_stops_after_max_frames_or_ctrl_c(finished: Path, tmp_path: Path) -> None:
    out = tmp_path / finished.name
    out.write_bytes(finished.read_bytes())
    complete = load_manifest(manifest_path(finished))
    assert complete is not None
    manifest_path(out).write_text(complete.model_copy(update={"status": "running"}).model_dump_json())
    with out.open("rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        slept: list[float] = []
        assert (
            watch(lambda: status_frame(out, False), 5.0, _console(), sleep=slept.append, max_frames=3) == 10
        )
        assert slept == [5.0, 5.0]

        def interrupted(_seconds: float) -> None:
            raise KeyboardInterrupt

        # Ctrl-C stops the watcher (not the job): the exit status is the last frame's, running
        assert watch(lambda: status_frame(out, False), 5.0, _console(), sleep=interrupted) == 10


def test_watch_refuses_a_bad_interval(capsys: pytest.CaptureFixture[str], finished: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["job", "status", str(finished), "--watch", "0"])
    assert exc.value.code == 2 and "not a positive number of seconds" in capsys.readouterr().err


def test_watch_before_out_says_where_to_put_it(capsys: pytest.CaptureFixture[str], finished: Path) -> None:
    """`job status --watch OUT` reads OUT as --watch's seconds: the error says how to write it."""
    with pytest.raises(SystemExit) as exc:
        cli_main(["job", "status", "--watch", str(finished)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "write --watch after the other arguments" in err, err


def test_watch_off_a_terminal_ends_its_frame_with_a_newline(
    capsys: pytest.CaptureFixture[str], finished: Path
) -> None:
    """`job status OUT --watch | cat` of a finished job: its last line is ended."""
    assert cli_main(["job", "status", str(finished), "--watch"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(" stalls\n") and f"{finished}: complete" in out, repr(out)


def test_the_timeline_samples_the_job_per_endpoint(finished: Path) -> None:
    samples = load_timeline(finished)
    assert len(samples) >= 2
    first, last = samples[0], samples[-1]
    assert last["done"] == last["total"] == 12 and last["failed"] == 0
    assert last["run"] == first["run"] == 1
    (url,) = last["endpoints"]
    assert last["endpoints"][url]["ok"] == 12 and last["endpoints"][url]["in_flight"] == 0
    assert [s["done"] for s in samples] == sorted(s["done"] for s in samples)
    series = job_series(samples)
    assert series["unit"] == "seconds" and series["total"] == 12
    assert all(r is None or r >= 0 for r in series["endpoints"][url])


def test_the_timeline_stays_bounded(tmp_path: Path) -> None:
    writer = TimelineWriter(tmp_path / "out.jsonl", max_samples=10)
    for i in range(25):
        writer.append(
            {"t": f"2026-12-04T15:00:{i:02d}+00:00", "run": 1, "total": 25, "done": i, "endpoints": {}}
        )
    kept = [json.loads(line) for line in timeline_path(tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(kept) <= 10
    assert kept[0]["done"] == 0 and kept[-1]["done"] == 24  # the first and the latest are kept
    assert [k["done"] for k in kept] == sorted(k["done"] for k in kept)


def test_no_rate_spans_two_runs() -> None:
    def sample(second: int, run: int, ok: int) -> dict:  # type: ignore[type-arg]
        return {"t": f"2026-12-04T15:00:{second:02d}+00:00", "run": run, "total": 100, "done": ok,
                "endpoints": {"http://a": {"ok": ok, "errors": 0, "in_flight": 1, "up": True}}}  # fmt: skip

    # run 2 starts its counter again at 0: a rate from 40 (run 1) to 0 (run 2) would be negative
    series = job_series([sample(0, 1, 0), sample(10, 1, 40), sample(20, 2, 0), sample(30, 2, 30)])
    assert series["endpoints"]["http://a"] == [4.0, 3.0]


def test_job_report_draws_a_png(finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / "job.png"
    assert cli_main(["job", "report", str(finished), "-o", str(chart)]) == 0
    assert chart.read_bytes().startswith(PNG) and chart.stat().st_size > 10_000
    assert f"report: {chart}" in capsys.readouterr().out


def test_a_job_too_short_for_a_line_still_shows_its_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's Try job: two samples 56 ms apart give one rate per panel; a line through one point draws
    nothing (the panels read empty), so the rates are drawn as dots."""
    from matplotlib.axes import Axes

    drawn: list[tuple[int, object]] = []
    plot = Axes.plot

    def recording(self: Axes, *args: object, **kwargs: object) -> object:
        lines = plot(self, *args, **kwargs)
        drawn.extend((len(line.get_xdata()), line.get_marker()) for line in lines)
        return lines

    monkeypatch.setattr(Axes, "plot", recording)
    url = "http://127.0.0.1:31000"
    samples = [
        {"t": "2026-12-04T16:33:45.107+00:00", "run": 1, "total": 8, "done": 0, "completion_tokens": 0,
         "endpoints": {url: {"ok": 0, "errors": 0, "in_flight": 0, "up": True}}},
        {"t": "2026-12-04T16:33:45.163+00:00", "run": 1, "total": 8, "done": 8, "completion_tokens": 440,
         "endpoints": {url: {"ok": 8, "errors": 0, "in_flight": 0, "up": True}}},
    ]  # fmt: skip
    job_chart(samples, tmp_path / "short.png", title="short")
    single = [marker for points, marker in drawn if points == 1]
    assert len(single) == 2 and all(m not in ("", "None", None) for m in single), drawn


def test_job_report_without_a_timeline_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["job", "report", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl.timeline.jsonl: no timeline" in capsys.readouterr().err


def test_job_report_without_the_plot_extra_names_it(finished: Path) -> None:
    probe = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if the extra were not installed
        "from sglfleet.cli import main\n"
        f"sys.exit(main(['job', 'report', {str(finished)!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "matplotlib is missing; install the plot extra: pip install 'sglfleet[plot]'" in proc.stderr


def test_a_resumed_job_says_how_much_was_done(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    write_batch(inp, 12)
    out = tmp_path / "out.jsonl"
    with fleet({}) as servers:
        assert run_job(inp, out, [servers[0].base_url]).exit_code == 0
        capsys.readouterr()
        lines = out.read_bytes().splitlines(keepends=True)
        out.write_bytes(b"".join(lines[:5]))  # the disk is the truth: 5 done, 7 to send again
        assert run_job(inp, out, [servers[0].base_url]).exit_code == 0
    assert "resuming: 5 of 12 already done" in capsys.readouterr().err
