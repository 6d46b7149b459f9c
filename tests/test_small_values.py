"""Small numbers shown truthfully, and ``logs``' share of step under the one definition.

- :func:`analysis.render.report.units.fixed`: an exact zero prints ``0``; a nonzero value that
  would round to zero prints ``<`` the column's smallest step (``<0.001 s``, ``<1%``), never
  ``0``; a percentage that is not 100 never prints ``100``.
- ``logs`` on a real VeRL 0.9.1 console log: share of step = the median over steps of (phase
  seconds / step seconds), with p10–p90, as for traces (``analysis/aggregate/shares.py``).
- ``fidelity`` and ``report`` on the real CPU VeRL capture, and ``report`` on a real 2-GPU H100
  export: a 15 µs stage, a 0.11 ms phase and a 99.53% busy read as such.

Every expected number is computed here from the raw input: the log's lines with a regex,
``phases.csv`` with the csv module.
"""

from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.render.report.units import Column, duration, fixed, humanize
from nvtxp_testkit import brute_quantile, shared_trace
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data" / "verl_cpu_run"
LOG = DATA / "verl_console.log"
SQLITE = DATA / "verl_grpo.sqlite"
#: VeRL 0.9.1 times these outside the step: not phases of it (README, ``logs``)
OUTSIDE_STEP = {"start_profile", "stop_profile", "testing"}
runner = CliRunner()


# --- the rule, on constructed values ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "digits", "options", "text"),
    [
        (0.0, 2, {}, "0"),  # an exact zero is 0
        (0.004, 2, {}, "<0.01"),  # tiny positive: under the column's last digit
        (0.00011, 3, {}, "<0.001"),
        (-0.004, 2, {}, "-<0.01"),  # tiny negative: never -0.00, never 0
        (0.0014, 2, {"sign": True}, "+<0.01"),
        (-0.0014, 2, {"sign": True}, "-<0.01"),
        (221.37, 2, {"sign": True}, "+221.37"),
        (1234.5678, 1, {}, "1,234.6"),
        (99.53, 0, {"pct": True}, "99.5"),  # below 100: never 100
        (99.9986, 2, {"pct": True}, "99.999"),
        (99.9999999, 0, {"pct": True}, ">99.999"),
        (100.0, 0, {"pct": True}, "100"),
        (100.2, 0, {"pct": True}, "100.2"),
        (0.4, 0, {"pct": True}, "<1"),  # above 0: never 0
        (0.0, 0, {"pct": True}, "0"),
        (67.4, 0, {"pct": True}, "67"),
    ],
)
def test_fixed_never_shows_a_wrong_zero_or_hundred(value, digits, options, text):
    assert fixed(value, digits, **options) == text


@pytest.mark.parametrize(
    ("column", "value", "text"),
    [
        (Column("wall_s", "wall time", "s", 3), 0.00011, "<0.001 s"),
        (Column("wall_s", "wall time", "s", 3), 0.0, "0 s"),
        (Column("busy_pct", "GPU busy", "%", 0), 99.53, "99.5%"),
        (Column("busy_pct", "GPU busy", "%", 0), 0.4, "<1%"),
        (Column("busy_pct", "GPU busy", "%", 0), 0.0, "0%"),
        (Column("above_idle_j", "energy above idle", "J", 2), -1e-9, "-<0.01 J"),
    ],
)
def test_report_cells_follow_the_rule(column, value, text):
    assert column.cell(value) == text


def test_humanize_keeps_a_tiny_phase_in_a_column_of_seconds():
    # 0.11 ms beside 61.9 s: the column is in s, 2 decimals (its typical value is 31 s)
    frame = pl.DataFrame({"wall_ns": [112_178, 61_910_000_000, 0], "busy_pct": [99.53, 12.0, 0.4]})
    table = humanize("t", frame)
    assert [row[0] for row in table.rows()] == ["<0.01 s", "61.91 s", "0 s"]
    assert [row[1] for row in table.rows()] == ["99.5%", "12%", "<1%"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (15.26e-6, "15.26 µs"),
        (0.5621, "562.1 ms"),
        (65.918858, "65.92 s"),
        (0.99996e-3, "1.000 ms"),  # rounded before the unit is chosen
        (0.0, "0 s"),
    ],
)
def test_duration_reads_in_its_unit(seconds, text):
    assert duration(seconds) == text


# --- the real VeRL console log, by hand -------------------------------------------------------


def _logged_timers() -> dict[int, dict[str, float]]:
    """``{step: {stage: seconds}}`` of every ``timing_s/<stage>`` on the log's step lines."""
    steps: dict[int, dict[str, float]] = {}
    for line in LOG.read_text(encoding="utf-8", errors="replace").splitlines():
        start = re.search(r"step:(\d+) - ", line)
        if start:
            timers = re.findall(r"timing_s/(\w+):([-+0-9.eE]+)(?= - |\s*$)", line)
            steps[int(start.group(1))] = {k: float(v) for k, v in timers}
    return steps


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p10, median, p90 by linear interpolation (numpy.percentile's default), by hand."""
    return (brute_quantile(values, 0.1), brute_quantile(values, 0.5), brute_quantile(values, 0.9))


def _shares_by_hand() -> dict[str, dict[int, float]]:
    """Per phase (and ``other (not timed)``): its share of each step, in %."""
    shares: dict[str, dict[int, float]] = {}
    for step, timers in _logged_timers().items():
        phases = {k: v for k, v in timers.items() if k not in OUTSIDE_STEP | {"step"}}
        for phase, seconds in phases.items():
            shares.setdefault(phase, {})[step] = 100 * seconds / timers["step"]
        other = timers["step"] - sum(phases.values())
        shares.setdefault("other (not timed)", {})[step] = 100 * other / timers["step"]
    return shares


def test_logs_share_of_step_is_the_median_over_steps(tmp_path):
    out = tmp_path / "logs"
    result = runner.invoke(app, ["logs", str(LOG), "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    expected = _shares_by_hand()
    assert len(expected["gen"]) == 2  # 97.07% and 21.67%
    with (out / "phase_summary.csv").open() as handle:
        rows = {row["phase"]: row for row in csv.DictReader(handle)}
    for phase, per_step in expected.items():
        p10, median, p90 = _percentiles(list(per_step.values()))
        row = rows[phase]
        got = [float(row[c]) for c in ("share_p10_pct", "share_median_pct", "share_p90_pct")]
        assert got == pytest.approx([p10, median, p90], rel=1e-9), phase
    gen = _percentiles(list(expected["gen"].values()))
    # before: 95.4% (all steps' gen seconds over all steps' seconds)
    assert f"{gen[1]:.1f}%" == "59.4%"
    assert "59.4%" in result.output and "95.4%" not in result.output
    assert "share of step (median over steps)" in result.output
    markdown = (out / "phase_summary.md").read_text()
    assert f"| {gen[1]:.1f}% | {gen[0]:.1f}%–{gen[2]:.1f}% |" in markdown
    # reward: 15 µs a step, 0.0005% of it: ran, so never 0.000 s or 0.0%
    assert "| reward | 2 | <0.001 | <0.001–<0.001 | <0.1% | <0.1%–<0.1% |" in markdown
    assert re.search(r"reward\s+│\s+2\s+│\s+<0\.001\s+│", result.output)
    # the figure stacks each step's shares: exactly the per-step shares of the definition
    with (out / "figures" / "phase_share.csv").open() as handle:
        drawn = list(csv.DictReader(handle))
    for row in drawn:
        assert float(row["share_pct"]) == pytest.approx(
            expected[row["phase"]][int(row["label"])], rel=1e-9
        )
    assert len(drawn) == sum(len(v) for v in expected.values())


# --- fidelity and report on the real CPU capture ----------------------------------------------


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verl") / "run"
    result = runner.invoke(app, ["analyze", str(SQLITE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _phase_rows(run: Path, path: str, attribution: str) -> list[dict[str, str]]:
    with (run / "phases.csv").open() as handle:
        return [
            r
            for r in csv.DictReader(handle)
            if r["path"] == path and r["attribution"] == attribution
        ]


def test_fidelity_shows_microsecond_stages_in_microseconds(verl_run, tmp_path):
    out = tmp_path / "fid"
    args = ["fidelity", str(verl_run), "--log", str(LOG), "--out", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    logged = {s: t["reward"] for s, t in _logged_timers().items()}
    traced = {
        int(r["step"]): int(r["wall_ns"]) / 1e9
        for r in _phase_rows(verl_run, "step/reward", "window")
    }
    assert sorted(traced) == sorted(logged) == [1, 2]  # the trace carries VeRL's numbers
    errors = [(traced[s] - logged[s]) / logged[s] * 100 for s in logged]
    mean_logged = statistics.mean(logged.values()) * 1e6
    mean_traced = statistics.mean(traced.values()) * 1e6
    error = statistics.mean(errors)
    # before: "| reward | 2 | 0.0000 | 0.0000 | +221.37 | 221.37 | not scored |"
    row = (
        f"| reward | 2 | {mean_logged:.2f} µs | {mean_traced:.2f} µs | {error:+.2f} | "
        f"{statistics.mean(map(abs, errors)):.2f} | not scored |"
    )
    assert row == "| reward | 2 | 15.06 µs | 48.44 µs | +221.37 | 221.37 | not scored |"
    summary = (out / "summary.md").read_text()
    assert row in summary and row in result.output
    assert "0.0000" not in summary
    # step 1: 0.0002% off, so its accuracy is 99.9998, not 100.00
    step = next(line for line in summary.splitlines() if line.startswith("| step |"))
    step_trace = int(_phase_rows(verl_run, "step", "window")[0]["wall_ns"]) / 1e9
    step_error = (step_trace - _logged_timers()[1]["step"]) / _logged_timers()[1]["step"] * 100
    assert 0 < abs(step_error) < 0.005
    cells = [c.strip() for c in step.strip("|").split("|")]
    assert cells[4] == ("+<0.01" if step_error > 0 else "-<0.01") and cells[5] == "<0.01"
    assert cells[6] != "100.00" and float(cells[6]) == pytest.approx(
        100 - abs(step_error), abs=1e-4
    )


def test_report_shows_a_phase_that_ran_as_under_the_last_digit(verl_run):
    result = runner.invoke(app, ["report", str(verl_run), "--out", str(verl_run)])
    assert result.exit_code == 0, result.output
    markdown = (verl_run / "report.md").read_text()
    for path in ("start_profile", "step/reward", "kv_cache_sleep"):
        walls = [int(r["wall_ns"]) for r in _phase_rows(verl_run, path, "window") if r["step"]]
        assert len(walls) == 2 and 0 < statistics.median(walls) < 500_000  # 0.03–0.11 ms
        # the column is in s to 3 decimals (the step's 61.9 s sets it); before: "0 s"
        row = f"| {path} | window | 2 | \\<0.001 s | \\<0.001 s | \\<0.001 s |"
        assert row in markdown, path
    assert "&lt;0.001 s</td>" in (verl_run / "report.html").read_text()


# --- report on a real 2-GPU H100 export -------------------------------------------------------


def test_report_never_rounds_a_busy_below_100_to_100(tmp_path):
    trace = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    out = tmp_path / "h100"
    args = ["analyze", str(trace), "--all-ranges", "--strip-args", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    assert runner.invoke(app, ["report", str(out), "--out", str(out)]).exit_code == 0
    rows = _phase_rows(out, "aten::view", "projection")
    busy = sum(int(r["process_gpu_busy_ns"]) for r in rows)
    capacity = busy + sum(int(r["process_idle_ns"]) for r in rows)
    assert 100 * busy / capacity == pytest.approx(99.53, abs=0.005)
    lines = (out / "report.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| phase path |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("process GPU busy")
    table = [line for line in lines if line.startswith("| aten::view | projection |")]
    assert [c.strip() for c in table[0].strip("|").split("|")][column] == "99.5%"  # was 100%
    # every shown percentage: "100%" only for exactly 100, "0%" only for exactly 0
    with (out / "tables" / "phase_summary.csv").open() as handle:
        values = {
            (r["path"], r["attribution"]): r for r in csv.DictReader(handle)
        }  # the report's own CSV: the raw value behind each rendered cell
    checked = 0
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        raw = values[(cells[0].replace("\\", ""), cells[1])]["process_gpu_busy_pct"]
        if raw:
            assert (cells[column] == "100%") == (float(raw) == 100), line
            assert (cells[column] == "0%") == (float(raw) == 0), line
            checked += 1
    assert checked > 50
