"""``nvtx-phases study``: the study file's checks, the tidy table against plain SQL, left-out runs,
figures with their CSV, and the command end to end on the bundled samples (≥ 3 axes)."""

from __future__ import annotations

import csv
import sqlite3
import statistics
from pathlib import Path

import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import WorkloadInputError
from nvtx_phases.analysis.workload.study import parse_study, shared_runs
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

RULE = SAMPLES / "grpo_synthetic.sqlite"
RM = SAMPLES / "grpo_synthetic_rm.sqlite"
CPU = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"


def _toml(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "study.toml"
    file.write_text(text, encoding="utf-8")
    return file


def _run(label: str, path: Path, axes: str) -> str:
    return f'[[run]]\nlabel = "{label}"\npath = "{path}"\naxes = {{ {axes} }}\n'


def test_unknown_keys_are_named(tmp_path):
    file = _toml(tmp_path, _run("a", RULE, 'reward = "rule"') + 'colour = "red"\n')
    with pytest.raises(WorkloadInputError, match=r"unknown key.*colour"):
        parse_study(file)
    with pytest.raises(WorkloadInputError, match=r"unknown key.*bogus"):
        parse_study(_toml(tmp_path, "bogus = 1\n" + _run("a", RULE, "")))


def test_missing_path_and_duplicate_labels(tmp_path):
    with pytest.raises(WorkloadInputError, match="does not exist"):
        parse_study(_toml(tmp_path, _run("a", tmp_path / "nope.sqlite", "")))
    with pytest.raises(WorkloadInputError, match=r"duplicate run label.*a"):
        parse_study(_toml(tmp_path, _run("a", RULE, "") + _run("a", RM, "")))


def test_relative_paths_resolve_against_the_file(tmp_path):
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "r.sqlite"
    target.write_bytes(RULE.read_bytes())
    study = parse_study(_toml(tmp_path, _run("a", Path("runs/r.sqlite"), "n_gpus = 2")))
    assert study.runs[0].paths == (target,)
    assert study.axes == ("n_gpus",)


def test_runs_sharing_no_phase_are_left_out():
    kept, left = shared_runs({"a": {("x", "w")}, "b": {("x", "w")}, "c": {("y", "w")}})
    assert kept == ["a", "b"]
    assert list(left) == ["c"] and "shares no phase" in left["c"]


def _sql_median_ms(path: Path, name: str) -> float:
    """The driver's NVTX ranges called ``name``: median duration in ms (plain SQL, stdlib)."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT e.end - e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) = ?",
            (name,),
        ).fetchall()
    return statistics.median(r[0] for r in rows) / 1e6


def test_study_end_to_end_on_the_samples(tmp_path):
    axes = 'policy = "grpo", hardware = "synthetic", n_gpus = 2, task = "math"'
    file = _toml(
        tmp_path,
        'title = "rule <b>vs</b> model"\n'
        + _run("rule", RULE, f'reward = "rule", {axes}')
        + _run("model", RM, f'reward = "model", {axes}')
        + _run("cpu", CPU, 'policy = "ppo", hardware = "cpu"'),
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "study.csv").open(encoding="utf-8")))
    assert {"run", "policy", "reward", "hardware", "n_gpus", "task", "metric", "value"} <= set(
        rows[0]
    )

    def value(run: str, path: str, metric: str) -> str:
        (hit,) = [
            r["value"]
            for r in rows
            if (r["run"], r["path"], r["attribution"], r["metric"]) == (run, path, "window", metric)
        ]
        return hit

    for run, trace in (("rule", RULE), ("model", RM), ("cpu", CPU)):
        for phase in ("step", "reward"):
            path = "step" if phase == "step" else "step/reward"
            assert float(value(run, path, "wall_ms")) == pytest.approx(
                _sql_median_ms(trace, phase), rel=1e-9
            )
    assert value("cpu", "step/reward", "energy_j") == ""  # no power samples: null, never 0
    assert {r["reward"] for r in rows if r["run"] == "cpu"} == {""}
    figures = sorted((out / "figures").glob("*.png"))
    assert {p.stem for p in figures} >= {"study_phase_signature", "study_reward_cost"}
    for png in figures:
        assert png.with_suffix(".csv").exists(), png
    assert "n_gpus axis has fewer than two values" in result.output  # said, not drawn
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "rule &lt;b&gt;vs&lt;/b&gt; model" in html and "<b>vs</b>" not in html
    assert (out / "report.md").exists()


def test_bad_study_is_one_line(tmp_path):
    file = _toml(tmp_path, _run("a", RULE, "") + "oops = 1\n")
    result = CliRunner().invoke(app, ["study", str(file), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert "oops" in result.output and "Traceback" not in result.output


def _wall_rows(runs):
    import polars as pl

    return pl.DataFrame(
        [
            {
                "run": r,
                "hardware": "h",
                "n_gpus": n,
                "path": "step",
                "attribution": "window",
                "metric": "wall_ms",
                "value": t,
            }
            for r, n, t in runs
        ]
    )


def test_parallel_efficiency_per_sample_and_assumed():
    """Weak scaling (batch doubled with the GPUs, same time) is efficiency 1 per sample; a
    point without sample counts falls back to the fixed-batch reading, said in ``basis``."""
    from nvtx_phases.analysis.workload.study_views import parallel_efficiency

    tidy = _wall_rows([("a", 2, 100.0), ("b", 4, 100.0), ("c", 4, 120.0)])
    per_sample = parallel_efficiency(tidy, samples={"a": 64.0, "b": 128.0}).sort("n_gpus")
    assert per_sample["basis"].to_list() == ["per_sample", "per_sample"]
    # by hand: base 100·2/64; at 4 GPUs only b has a count: 100·4/128
    assert per_sample["efficiency"].to_list() == pytest.approx([1.0, (200 / 64) / (400 / 128)])
    assumed = parallel_efficiency(tidy, samples={"a": 64.0}).sort("n_gpus")
    assert assumed["basis"].to_list() == ["fixed_batch_assumed"] * 2
    # median time at 4 GPUs is 110 ms: 100·2 / (110·4)
    assert assumed["efficiency"].to_list() == pytest.approx([1.0, 200 / 440])


def test_power_key_applies_the_samples_and_verl_log_is_refused(tmp_path):
    """A trace moved away from its power samples gets them back with ``power =``; a key the
    study cannot use (``verl_log``) is refused by name, never accepted and ignored."""
    import shutil

    copy = tmp_path / "moved.sqlite"
    shutil.copy(RULE, copy)
    power = SAMPLES / "grpo_synthetic.power.parquet"
    axes = 'reward = "rule", n_gpus = 2'
    file = _toml(
        tmp_path,
        _run("bare", copy, axes)
        + _run("powered", copy, axes)
        + f'power = "{power}"\n'
        + _run("orig", RULE, axes),
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    energy = {
        r["run"]: r["value"]
        for r in csv.DictReader((out / "study.csv").open(encoding="utf-8"))
        if r["metric"] == "energy_j" and r["path"] == "step" and r["attribution"] == "window"
    }
    assert energy["bare"] == ""  # no samples beside the moved copy: empty, not 0
    assert energy["powered"] == energy["orig"] != ""
    bad = _toml(tmp_path, _run("x", RULE, axes) + 'verl_log = "log.txt"\n')
    result = CliRunner().invoke(app, ["study", str(bad), "--out", str(out)])
    assert result.exit_code == 2 and "verl_log" in result.output


def test_a_cpu_run_has_wall_times_and_no_gpu_figures(tmp_path):
    """The CPU capture (no GPU in it) reads empty GPU figures in the study, never 0."""
    file = _toml(tmp_path, _run("rule", RULE, "n_gpus = 2") + _run("cpu", CPU, "n_gpus = 1"))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", str(file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    cpu = [
        r
        for r in csv.DictReader((out / "study.csv").open(encoding="utf-8"))
        if r["run"] == "cpu" and r["path"] == "step/reward"
    ]
    assert cpu and all(r["value"] != "" for r in cpu if r["metric"] == "wall_ms")
    timed = {"wall_ms", "time_share_pct"}  # time is known on a CPU; nothing of GPUs
    assert all(r["value"] != "" for r in cpu if r["metric"] in timed)
    assert all(r["value"] == "" for r in cpu if r["metric"] not in timed)
