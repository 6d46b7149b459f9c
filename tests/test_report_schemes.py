"""The GPU time headline names the scheme of each number, and ``report`` takes the range options.

Every number is checked against a computation of its own: the total by plain SQL over the
export's CUPTI tables, the operations without a launching call by a LEFT JOIN on
``correlationId``, the attributed part against the top-level rows of ``phases.csv``, and the
headline's text against ``summary.json`` read as JSON.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

runner = CliRunner()

WINDOW_LABEL = "window (driver phases, every GPU's work inside them)"
PROJECTION_LABEL = "projection (ranges, the work their own thread launched)"
NO_STEPS_TITLE = "Phases (no step ranges: whole capture, 2 GPU(s))"
OP_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUDA_GRAPH_TRACE",
)
#: the GPU time columns of a phase row
TIME_COLUMNS = ("kernel_ns", "memcpy_ns", "memset_ns", "graph_ns")
RANGE_OPTIONS = ["--all-ranges", "--strip-args"]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.2f} ms"


def _op_union(db: sqlite3.Connection) -> str:
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return " UNION ALL ".join(
        f"SELECT correlationId, globalPid, start, end FROM {t}" for t in OP_TABLES if t in tables
    )


def sql_totals(trace: Path) -> tuple[int, int, int]:
    """(operations, Σ end − start, Σ end − start of operations without a runtime call)."""
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        ops = _op_union(db)
        n, total = db.execute(f"SELECT count(*), sum(end - start) FROM ({ops})").fetchone()
        (orphan,) = db.execute(
            f"SELECT coalesce(sum(o.end - o.start), 0) FROM ({ops}) o "
            "LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId "
            "AND r.globalTid / 16777216 = o.globalPid / 16777216 "  # the same process
            "WHERE r.correlationId IS NULL"
        ).fetchone()
    return n, total, orphan


def _headline(folder: Path) -> str:
    lines = (folder / "report.md").read_text(encoding="utf-8").splitlines()
    return next(line for line in lines if line.startswith("- **GPU time**: "))


def _flat(text: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(text.split())


def _analyze(trace: Path, out: Path, *options: str) -> str:
    args = ["analyze", str(trace), "--out", str(out), "--no-figures", "--max-rows", "4"]
    done = runner.invoke(app, [*args, *options])
    assert done.exit_code == 0, done.output
    return done.output


def _report(inputs: Path, out: Path, *options: str) -> None:
    done = runner.invoke(app, ["report", str(inputs), "--out", str(out), *options])
    assert done.exit_code == 0, done.output


@pytest.fixture(scope="module", params=["nsysai_h100_2gpu_1s", "nsysai_mfu_2gpu_before"])
def pytorch_run(request, tmp_path_factory):
    """A plain PyTorch export analyzed with every range a phase, then reported from the folder."""
    trace = shared_trace(f"{request.param}.sqlite")
    out = tmp_path_factory.mktemp(request.param)
    printed = _analyze(trace, out, *RANGE_OPTIONS)
    _report(out, out)
    return trace, out, printed


def test_pytorch_export_headline_shows_projection_not_window(pytorch_run):
    trace, out, printed = pytorch_run
    n_ops, total, orphan = sql_totals(trace)
    summary = json.loads((out / "summary.json").read_text())
    phases = pl.read_csv(out / "phases.csv", infer_schema_length=None)
    assert set(phases["attribution"]) == {"projection"}  # no driver: no window phase
    attributed = summary["projection_attributed_gpu_ns"]
    unattributed = summary["projection_unattributed_gpu_ns"]
    assert summary["total_gpu_ns"] == total and attributed + unattributed == total
    # operations whose launching call is not in the export cannot be projected onto a range
    assert orphan > 0 and unattributed >= orphan
    top = phases.filter(pl.col("level") == 0).select(pl.sum_horizontal(*TIME_COLUMNS).sum())
    assert top.item() == attributed
    share = f"{100 * unattributed / total:.1f} %"
    assert _headline(out) == (
        f"- **GPU time**: {_ms(total)}; {PROJECTION_LABEL}: {_ms(attributed)} in phases, "
        f"{_ms(unattributed)} unattributed ({share}); {WINDOW_LABEL}: no phases in this run"
    )
    # the window's total (GPU time inside any range) is no phase row's: never shown as one
    assert _ms(summary["attributed_gpu_ns"]) not in (out / "report.md").read_text()
    assert (
        f"GPU time {_ms(total)} in {n_ops:,} operations; {PROJECTION_LABEL}: {_ms(attributed)} "
        f"attributed, {_ms(unattributed)} unattributed ({share}); {WINDOW_LABEL}: no phases "
        "in this run"
    ) in _flat(printed)
    assert _ms(summary["attributed_gpu_ns"]) not in printed


def test_run_without_step_ranges_says_whole_capture(pytorch_run):
    _, out, printed = pytorch_run
    assert pl.read_csv(out / "phases.csv", infer_schema_length=None)["step"].null_count() > 0
    assert NO_STEPS_TITLE in printed
    assert "0 steps" not in printed
    assert "- **steps**: no step ranges: whole capture" in (out / "report.md").read_text()


def test_sample_headline_shows_both_schemes(tmp_path):
    trace = SAMPLES / "grpo_synthetic.sqlite"
    printed = _analyze(trace, tmp_path)
    _report(tmp_path, tmp_path)
    n_ops, total, orphan = sql_totals(trace)
    s = json.loads((tmp_path / "summary.json").read_text())
    phases = pl.read_csv(tmp_path / "phases.csv", infer_schema_length=None)
    assert set(phases["attribution"]) == {"window", "projection"}
    window = (s["attributed_gpu_ns"], s["unattributed_gpu_ns"])
    projection = (s["projection_attributed_gpu_ns"], s["projection_unattributed_gpu_ns"])
    assert s["total_gpu_ns"] == total == sum(window) == sum(projection)
    assert projection[1] >= orphan
    top = phases.filter((pl.col("level") == 0) & (pl.col("attribution") == "projection"))
    assert top.select(pl.sum_horizontal(*TIME_COLUMNS).sum()).item() == projection[0]

    def part(label: str, sides: tuple[int, int], word: str) -> str:
        share = f"{100 * sides[1] / total:.1f} %"
        return f"{label}: {_ms(sides[0])} {word}, {_ms(sides[1])} unattributed ({share})"

    assert _headline(tmp_path) == (
        f"- **GPU time**: {_ms(total)}; {part(WINDOW_LABEL, window, 'in phases')}; "
        f"{part(PROJECTION_LABEL, projection, 'in phases')}"
    )
    line = (
        f"GPU time {_ms(total)} in {n_ops:,} operations; "
        f"{part(WINDOW_LABEL, window, 'attributed')}; "
        f"{part(PROJECTION_LABEL, projection, 'attributed')}"
    )
    assert line in _flat(printed)
    assert "Phases per step (3 steps, 2 GPU(s))" in printed


def test_run_without_phases_has_none_in_phases(tmp_path):
    trace = shared_trace("pipit_cloverleaf_4xA100_nsys2024.5.sqlite")  # no NVTX at all
    printed = _analyze(trace, tmp_path)
    _report(tmp_path, tmp_path)
    _, total, _ = sql_totals(trace)
    expected = f"{_ms(total)}; none in phases (the run has no phase rows)"
    assert _headline(tmp_path) == f"- **GPU time**: {expected}"
    assert f"GPU time {_ms(total)} in" in printed and "none in phases" in printed


def test_report_of_traces_takes_the_range_options(tmp_path):
    trace = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    direct, folder = tmp_path / "direct", tmp_path / "folder"
    _report(trace, direct, *RANGE_OPTIONS)
    _analyze(trace, folder, *RANGE_OPTIONS)
    _report(folder, folder)
    for name in ("report.md", "phases.csv", "tables/phase_summary.csv"):
        assert (direct / name).read_text() == (folder / name).read_text(), name
    phases = pl.read_csv(direct / "phases.csv", infer_schema_length=None)
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        (n_ranges,) = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE end > start").fetchone()
    assert phases["n_ranges"].sum() == n_ranges  # every range a phase (its args cut off)
    assert not phases["path"].str.contains(", op_id = ").any()
    options = json.loads((direct / "summary.json").read_text())["provenance"]["options"]
    assert options["all_ranges"] is True


def test_report_of_traces_takes_a_phase_map(tmp_path):
    trace = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    phase_map = tmp_path / "map.toml"
    phase_map.write_text('phases = ["aten::linear"]\n')
    _report(trace, tmp_path / "out", "--phase-map", str(phase_map), "--strip-args")
    phases = pl.read_csv(tmp_path / "out" / "phases.csv", infer_schema_length=None)
    assert set(phases["path"]) == {"aten::linear"}
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        (n_linear,) = db.execute(
            "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) LIKE 'aten::linear, %' AND e.end IS NOT NULL"
        ).fetchone()
    assert phases["n_ranges"].sum() == n_linear
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["provenance"]["options"]["phase_map"] == str(phase_map.absolute())


@pytest.mark.parametrize(
    "options", [["--all-ranges"], ["--strip-args"], ["--phase-map", "map.toml"], RANGE_OPTIONS]
)
def test_report_of_a_folder_refuses_range_options(tmp_path, options):
    folder = tmp_path / "run"
    _analyze(SAMPLES / "grpo_synthetic.sqlite", folder, "-q")
    (tmp_path / "map.toml").write_text('phases = ["extra"]\n')
    options = [str(tmp_path / o) if o.endswith(".toml") else o for o in options]
    done = runner.invoke(app, ["report", str(folder), "--out", str(tmp_path / "r"), *options])
    assert done.exit_code == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: --phase-map/--all-ranges/--strip-args apply to traces only")
    assert str(folder) in lines[0] and "analyzed with its own options" in lines[0]
    assert not (tmp_path / "r").exists()  # refused before anything is written
