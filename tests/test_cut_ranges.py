"""A range nsys closed at the capture's end never feeds a headline number silently.

Seen on a real VeRL 0.9.1 run (``tests/data/verl_cpu_run``, 2 steps): the trainer's process
exited before its last NVTX events were flushed, so nsys ended step 2's ``step`` range (and a
``reward_fn`` range) at ``ANALYSIS_DETAILS.duration``: 7.934 s traced for a step VeRL logged at
1.523 s. Such ranges are flagged (``cut_at_capture_end``) in ``ranges.parquet`` and the phase
table, and left out of shares, the per-step stack, what-if and the report's medians, each
output saying so once. Every expected number here is computed separately: plain SQL over the
export, or brute force over ``phases.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.phase_ranges import mark_cut
from nvtx_phases.analysis.render.outputs.files import load_analysis
from nvtx_phases.analysis.render.report.document import phase_summary
from nvtx_phases.analysis.render.report.findings import what_stands_out
from nvtxp_testkit import REPO, SAMPLES
from nvtxp_testkit import brute_quantile as quantile
from nvtxp_testkit import csv_rows as read_rows

VERL = REPO / "tests" / "data" / "verl_cpu_run" / "verl_grpo.sqlite"
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
LENGTHS = SAMPLES / "grpo_synthetic_lengths"
CUT = "cut_at_capture_end"


def cli(*args: str, cwd: Path = REPO, ok: bool = True) -> subprocess.CompletedProcess:
    """``python -m analysis.cli ARGS`` in its own process, from ``cwd`` (whose ``analysis`` runs)."""
    env = {**os.environ, "COLUMNS": "1000", "NVTX_PHASES_DRAW_WORKERS": "0"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_phases.analysis.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def capture_end_sql(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]


# --- brute force over phases.csv --------------------------------------------------------------------


def is_step_row(row: dict[str, str]) -> bool:
    path = row["path"]
    return row["step"] != "" and (
        path == "step" or (path.startswith("step/") and path.count("/") == 1)
    )


def cut_steps(rows: list[dict[str, str]]) -> set[str]:
    """Steps whose ``step`` row or a row directly inside it is cut."""
    return {r["step"] for r in rows if is_step_row(r) and r[CUT] == "true"}


def shares(rows: list[dict[str, str]]) -> dict[str, list[float]]:
    """Per phase: wall / the step's wall (%), over the steps that are not cut."""
    cut = cut_steps(rows)
    walls: dict[str, float] = defaultdict(float)
    inside: dict[tuple[str, str], float] = defaultdict(float)
    for r in rows:
        if not is_step_row(r) or r["step"] in cut:
            continue
        if r["path"] == "step":
            walls[r["step"]] += int(r["wall_ns"])
        else:
            inside[(r["step"], r["canonical"])] += int(r["wall_ns"])
    found: dict[str, list[float]] = defaultdict(list)
    for (step, name), wall in sorted(inside.items()):
        found[name].append(100 * wall / walls[step])
    return found


# --- the runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verl(tmp_path_factory) -> dict:
    """The VeRL capture analyzed, reported and bounded by whatif, as a new user runs them."""
    root = tmp_path_factory.mktemp("cut")
    out = root / "verl"
    cli("analyze", str(VERL), "--out", str(out), "-q")
    cli("report", str(out), "--out", str(root / "report"))
    done = cli("whatif", str(out), "--out", str(root / "whatif"))
    return {"out": out, "report": root / "report", "whatif": root / "whatif", "terminal": done}


def test_the_cut_ranges_are_those_plain_sql_finds(verl):
    out = verl["out"]
    end = capture_end_sql(VERL)
    with sqlite3.connect(f"file:{VERL}?mode=ro", uri=True) as db:
        expected = set(
            db.execute(
                "SELECT e.start, e.end, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
                "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end = ? AND e.start < ?",
                (end, end),
            )
        )
    assert {name for *_, name in expected} == {"step", "reward_fn"}
    (trace,) = json.loads((out / "summary.json").read_text())["traces"]
    offset = trace["clock_offset_ns"]
    assert trace["capture_end_ns"] == end + offset
    ranges = pl.read_parquet(out / "ranges.parquet")
    flagged = ranges.filter(pl.col(CUT))
    assert {
        (s - offset, e - offset, n)
        for s, e, n in flagged.select("start_ns", "end_ns", "name").rows()
    } == expected
    assert (ranges.filter(~pl.col(CUT))["end_ns"] != end + offset).all()
    # a phase-table row is cut when one of its ranges is: its end is then the capture's end
    rows = read_rows(out / "phases.csv")
    assert list(rows[0])[-1] == CUT
    for r in rows:
        assert (r[CUT] == "true") == (int(r["end_ns"]) == end + offset), r
    assert {(r["step"], r["path"]) for r in rows if r[CUT] == "true"} == {
        ("2", "step"),
        ("2", "reward_fn"),
    }


def test_shares_and_the_step_stack_leave_the_cut_step_out(verl):
    out = verl["out"]
    rows = read_rows(out / "phases.csv")
    assert cut_steps(rows) == {"2"}
    expected = shares(rows)
    drawn = {r["phase"]: r for r in read_rows(out / "figures" / "phase_share.csv")}
    assert drawn.keys() == expected.keys()
    for name, values in expected.items():
        assert int(drawn[name]["n_steps"]) == len(values) == 1
        for q, column in ((0.1, "p10"), (0.5, "median"), (0.9, "p90")):
            got = float(drawn[name][f"time_share_{column}_pct"])
            assert got == pytest.approx(quantile(values, q), rel=1e-12)
    # step 1's gen over step 1's step range: 65918.95 ms of 67907.39 ms
    gen = float(drawn["gen"]["time_share_median_pct"])
    assert gen == pytest.approx(100 * 65_918_951_365 / 67_907_389_631, rel=1e-12)
    stack = read_rows(out / "figures" / "phase_time_per_step.csv")
    assert {r["bar"] for r in stack} == {"1"}
    step_1 = next(r for r in rows if r["step"] == "1" and r["path"] == "step")
    total = sum(float(r["wall_ms"]) for r in stack)
    assert total == pytest.approx(int(step_1["wall_ns"]) / 1e6, rel=1e-12)


def test_report_medians_leave_out_cut_rows_and_say_so(verl):
    rows = read_rows(verl["out"] / "phases.csv")
    per_step: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["step"] and r[CUT] == "false":
            key, step = (r["path"], r["attribution"]), r["step"]
            per_step[key][step] = max(per_step[key].get(step, 0), int(r["wall_ns"]) / 1e9)
    table = read_rows(verl["report"] / "tables" / "phase_summary.csv")
    assert {(r["path"], r["attribution"]) for r in table} == set(per_step)
    for r in table:
        values = list(per_step[(r["path"], r["attribution"])].values())
        assert int(r["n_steps"]) == len(values)
        assert float(r["wall_s"]) == pytest.approx(quantile(values, 0.5), rel=1e-9)
        assert float(r["wall_s_p10"]) == pytest.approx(quantile(values, 0.1), rel=1e-9)
        assert float(r["wall_s_p90"]) == pytest.approx(quantile(values, 0.9), rel=1e-9)
    step = next(r for r in table if r["path"] == "step")
    assert (step["n_steps"], float(step["wall_s"])) == ("1", 67.907389631)
    reward = next(r for r in table if r["path"] == "reward_fn")
    assert (reward["n_steps"], float(reward["wall_s"])) == ("1", 0.020309182)
    text = (verl["report"] / "report.md").read_text(encoding="utf-8")
    gen = quantile(list(per_step[("step/gen", "window")].values()), 0.5)
    share = 100 * 65_918_951_365 / 67_907_389_631
    assert f"- step/gen takes the most time: {gen:.2f} s per step" in text
    assert f", {share:.1f}% of the step (p10–p90 {share:.1f}–{share:.1f}%)" in text
    notes = [line for line in text.splitlines() if "end of the capture" in line]
    assert notes[0].startswith(
        "- Cut at the capture's end: 2 phase row(s) (step 2: reward_fn, step) hold a range that "
        "ends exactly at the end of the capture"
    )
    assert "left out of the medians over steps, and step 2 out of the shares" in notes[0]


def test_whatif_leaves_the_cut_step_out_and_names_it(verl):
    rows = read_rows(verl["out"] / "phases.csv")
    driver = [r for r in rows if r["pid"] == "28466" and r["step"] == "1" and is_step_row(r)]
    step_ns = next(int(r["wall_ns"]) for r in driver if r["path"] == "step")
    covered_ns = sum(int(r["wall_ns"]) for r in driver if r["path"] != "step")
    table = read_rows(verl["whatif"] / "whatif.csv")
    assert {r["step"] for r in table} == {"1"}
    (gap,) = [r for r in table if r["bound"] == "no_transitions"]
    assert float(gap["measured_s"]) == pytest.approx(step_ns / 1e9, abs=1e-9)
    assert float(gap["bound_s"]) == pytest.approx(min(step_ns, covered_ns) / 1e9, abs=1e-9)
    line = (
        "step 2 left out of every bound and of the warm-up check: its step range (7.93 s) ends "
        "exactly at the end of the capture: nsys closes a range still open"
    )
    assert line in (verl["whatif"] / "whatif.md").read_text(encoding="utf-8")
    terminal = verl["terminal"].stdout
    assert f"warning: {line}" in terminal
    assert "warm-up" not in terminal.replace("warm-up check", "")  # one step left: no median


def test_a_run_whose_every_step_is_cut_says_so(verl, tmp_path):
    done = cli("whatif", str(verl["out"]), "--steps", "2", "--out", str(tmp_path / "w"), ok=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    said = done.stdout + done.stderr
    assert "every step (2) has a range that ends exactly at the end of the capture" in said
    assert not (tmp_path / "w" / "whatif.csv").exists()
    cli("report", str(verl["out"]), "--steps", "2", "--out", str(tmp_path / "r"))
    text = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert "every step is cut, so no share of the step is given" in text
    assert "of the step (p10–p90" not in text


def test_findings_of_a_run_whose_every_phase_row_is_cut(verl):
    run = load_analysis(verl["out"])
    run = dataclasses.replace(run, phases=run.phases.with_columns(pl.lit(True).alias(CUT)))
    findings = what_stands_out(run, phase_summary(run))
    assert [f.omitted for f in findings] == [True] * 4 + [False]
    assert findings[0].text == (
        "every phase row holds a range cut at the capture's end (the last line says why)"
    )
    assert findings[4].text.startswith(f"Cut at the capture's end: {run.phases.height} phase row")
    assert findings[4].text.endswith("every step is cut, so no share of the step is given.")


def test_mark_cut_is_the_warning_rule_on_the_runs_clock():
    ranges = pl.DataFrame(
        {
            "trace": ["a", "a", "a", "b", "c"],
            "start_ns": [10, 100, 150, 10, 10],
            "end_ns": [150, 150, 150, 150, 150],
        }
    )
    # a's capture ends at 150: a range ending there is cut, a zero-length one there is not;
    # b's ends later; c's end is unknown (not cut)
    marked = mark_cut(ranges, {"a": 150, "b": 200})
    assert marked[CUT].to_list() == [True, True, False, False, False]
    assert mark_cut(ranges, {})[CUT].to_list() == [False] * 5


# --- nothing cut: the same outputs as before -------------------------------------------------------


def test_a_capture_with_nothing_cut_flags_nothing_and_leaves_nothing_out(tmp_path):
    # (the byte comparison with the outputs before this change was made while it was developed;
    # the figure and what-if numbers of this run are checked against brute force in
    # tests/test_consistency.py and tests/test_figure_data.py)
    out = tmp_path / "now"
    cli("analyze", str(SAMPLE), "--out", str(out), "-q")
    cli("whatif", str(out), "--lengths", str(LENGTHS), "--out", str(out / "w"))
    rows = read_rows(out / "phases.csv")
    assert {r[CUT] for r in rows} == {"false"}
    steps = {r["step"] for r in rows if r["step"]}
    shares = read_rows(out / "figures" / "phase_share.csv")
    assert {int(r["n_steps"]) for r in shares} == {len(steps)}  # no step left out
    whatif = (out / "w" / "whatif.csv").read_bytes()
    assert "left out" not in (out / "w" / "whatif.md").read_text(encoding="utf-8")
    # length records found beside the traces an analysis folder was made from
    cli("whatif", str(out), "--out", str(tmp_path / "found"))
    assert (tmp_path / "found" / "whatif.csv").read_bytes() == whatif
    assert "p90_response" in whatif.decode() and "no length records" not in whatif.decode()
