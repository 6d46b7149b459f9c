"""Real exports other people committed to public repositories (../shared/traces/wild).

nsys 2021 to 2025, Linux, Windows and WSL hosts, odd bytes in TEXT columns, tables missing in old
schemas. Each file either analyzes with GPU totals equal to ``truth.tsv`` (plain SQL sums made
by the corpus's curator, not by this project) to the ns, or, holding no NVTX range and no GPU
operation, is refused in one line.
"""

from __future__ import annotations

import csv
import os

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import TRACES
from typer.testing import CliRunner

WILD = TRACES / "wild"


def _truth() -> dict[str, dict[str, int]]:
    path = WILD / "truth.tsv"
    if not path.exists():
        return {}
    with path.open(newline="") as handle:
        return {
            row["file"]: {k: int(v) for k, v in row.items() if k != "file"}
            for row in csv.DictReader(handle, delimiter="\t")
        }


TRUTH = _truth()


def _require_corpus() -> None:
    if not TRUTH:
        if os.environ.get("NVTX_PHASES_REQUIRE_SHARED") == "1":
            pytest.fail(f"{WILD} is required here (NVTX_PHASES_REQUIRE_SHARED=1) but missing")
        pytest.skip(f"{WILD} not present")


def test_corpus_is_complete():
    _require_corpus()
    assert len(TRUTH) == 32


ANALYZABLE = sorted(f for f, t in TRUTH.items() if t["gpu_ns"] or t["n_nvtx_ranges"])
EMPTY = sorted(f for f, t in TRUTH.items() if not (t["gpu_ns"] or t["n_nvtx_ranges"]))


@pytest.mark.parametrize("name", ANALYZABLE)
def test_totals_equal_plain_sql(name):
    _require_corpus()
    truth = TRUTH[name]
    result = analyze([WILD / name], power_files=[])
    s = result.summary.to_dict()
    # graph executions would count in total_gpu_ns too; no file of this corpus has that table
    assert s["n_graphs"] == 0
    assert (s["kernel_ns"], s["memcpy_ns"], s["memset_ns"], s["total_gpu_ns"], s["n_kernels"]) == (
        truth["kernel_ns"],
        truth["memcpy_ns"],
        truth["memset_ns"],
        truth["gpu_ns"],
        truth["n_kernels"],
    )
    kernels = result.kernels.filter(pl.col("op_class") != "cuda_graph")
    assert kernels.height == truth["n_kernel_names"]
    assert kernels["total_ns"].sum() == truth["kernel_ns"]


@pytest.mark.parametrize("name", EMPTY)
def test_nothing_to_analyze_is_one_line(name, tmp_path):
    _require_corpus()
    result = CliRunner().invoke(app, ["analyze", str(WILD / name), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "nothing to analyze" in lines[0]
    assert not (tmp_path / "o" / "summary.json").exists()


def test_old_export_without_metadata_says_version_unknown():
    """nsys 2021: no metadata table, no session start, TARGET_INFO_GPU keyed by deviceId."""
    _require_corpus()
    result = analyze([WILD / "martisu1631998__kmeans-parallel__report2.sqlite"], power_files=[])
    assert result.summary.to_dict()["traces"][0]["nsys_version"] == "unknown"
    assert any("nsys version unknown" in w for w in result.warnings)
    # its GPU is named by its bus location (that old TARGET_INFO_GPU has no UUID column)
    assert [d["device"] for d in result.summary.to_dict()["devices"]] == [
        "martisu1631998__kmeans-parallel__report2/0000:02:00.0"
    ]


def test_non_utf8_text_is_decoded_not_fatal():
    """Binary device info in TARGET_INFO_SYSTEM_ENV crashed the Arrow → Polars conversion."""
    _require_corpus()
    result = analyze([WILD / "kamalchowdhury326__HW5_helper__report1.sqlite"], power_files=[])
    assert result.summary.to_dict()["n_kernels"] == 505
    assert [d["identity"] for d in result.summary.to_dict()["devices"]] == ["uuid"]
