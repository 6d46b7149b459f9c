"""Figures drawn in worker processes (analysis.render.figures.drawing) and by the CLI with them."""

import os
import time

import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.render.figures.drawing import (
    WORKERS_ENV,
    Drawing,
    FigureTask,
    default_workers,
)
from typer.testing import CliRunner

TASK = "drawing_tasks:write_pid"
SAMPLE = "traces_sample/grpo_synthetic.sqlite"


def test_tasks_run_in_workers_and_come_back_in_the_order_given(tmp_path):
    # the first task is the slowest: its files still come first
    with Drawing(2) as drawing:
        for i, delay in enumerate((0.5, 0.0, 0.0)):
            drawing.draw(FigureTask(TASK, (tmp_path, f"f{i}"), {"delay_s": delay}))
        paths = drawing.drawn()
    assert [p.name for p in paths] == ["f0", "f1", "f2"]
    pids = {int(p.read_text()) for p in paths}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2


def test_without_workers_tasks_run_here_at_once(tmp_path):
    with Drawing(0) as drawing:
        drawing.draw(FigureTask(TASK, (tmp_path, "here")))
        assert (tmp_path / "here").read_text() == str(os.getpid())  # before drawn()
        assert drawing.drawn() == [tmp_path / "here"]


def test_a_task_error_is_raised_by_drawn(tmp_path):
    with Drawing(1) as drawing:
        drawing.draw(FigureTask(TASK, (tmp_path, "ok")))
        drawing.draw(FigureTask("drawing_tasks:fail", ("no such phase",)))
        with pytest.raises(ValueError, match="no such phase"):
            drawing.drawn()


def test_leaving_after_an_error_stops_the_workers_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(KeyError), Drawing(1) as drawing:
        drawing.draw(FigureTask(TASK, (tmp_path, "slow"), {"delay_s": 30}))
        raise KeyError("the analysis failed")
    assert time.monotonic() - started < 10
    assert not (tmp_path / "slow").exists()


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("3", 3), ("-2", 0), ("many", None)])
def test_workers_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(WORKERS_ENV, value)
    cores = len(os.sched_getaffinity(0))
    default = 0 if cores < 2 else min(4, cores)
    assert default_workers() == (default if expected is None else expected)


def test_cli_figures_drawn_by_workers_equal_figures_drawn_here(tmp_path, monkeypatch):
    """The same bytes, whichever process draws them (SVG ids and PNG are deterministic)."""
    runner = CliRunner()
    outs = {}
    for workers in ("2", "0"):
        monkeypatch.setenv(WORKERS_ENV, workers)
        out = tmp_path / f"w{workers}"
        result = runner.invoke(app, ["analyze", SAMPLE, "--out", str(out), "-q"])
        assert result.exit_code == 0, result.output
        outs[workers] = {p.name: p.read_bytes() for p in sorted((out / "figures").iterdir())}
    assert sorted(outs["2"]) == sorted(
        f"{stem}.{ext}"
        for stem in (
            "phase_time_per_step",
            "phase_share",
            "busy_idle_per_phase",
            "data_movement_per_phase",
            "energy_per_phase_device",
            "power_timeline",
            "power_timeline_detail",
            "power_envelope",
        )
        for ext in ("png", "svg", "csv")  # each figure's numbers beside it
    )
    assert outs["2"] == outs["0"]
