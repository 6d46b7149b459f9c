"""Agreement with NVIDIA's own reports (`nsys stats`) on the same files.

- kernels.csv per kernel name equals `gpukernsum` (summed over its grid/block groups);
- projection kernel time per (range name, pid) equals `nvtxkernsum` (summed over threads and
  kernel names): both use "ranges on the launching thread that enclose the launch call".
"""

import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import SAMPLES, shared_trace


def nsys_reports(nsys: str, export: Path, tmp_path: Path) -> dict[str, pl.DataFrame]:
    copy = tmp_path / export.name  # nsys stats may add temp tables: never touch the original
    shutil.copy(export, copy)
    prefix = tmp_path / "stats"
    subprocess.run(
        [
            nsys,
            "stats",
            "-q",
            "-r",
            "gpukernsum,nvtxkernsum",
            "-f",
            "csv",
            "-o",
            str(prefix),
            str(copy),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {
        report: pl.read_csv(f"{prefix}_{report}.csv", infer_schema_length=0)
        for report in ("gpukernsum", "nvtxkernsum")
    }


EXPORTS = [
    lambda: SAMPLES / "grpo_synthetic.sqlite",
    lambda: shared_trace("nsysai_mfu_2gpu_before.sqlite"),
    lambda: shared_trace("nsysai_h100_2gpu_1s.sqlite"),
]


@pytest.mark.parametrize("export_path", EXPORTS, ids=["synthetic", "h100_mfu_nccl", "h100_1s"])
def test_kernel_and_range_totals_equal_nsys_stats(nsys, tmp_path, export_path):
    export = export_path()
    reports = nsys_reports(nsys, export, tmp_path)
    result = analyze([export], phase_map=default_phase_map().with_all_ranges())

    theirs = (
        reports["gpukernsum"]
        .group_by(pl.col("Name").alias("name"))
        .agg(
            pl.col("Instances").cast(pl.Int64).sum().alias("count"),
            pl.col("Total Time (ns)").cast(pl.Int64).sum().alias("total_ns"),
        )
        .sort("name")
    )
    ours = result.kernels.select("name", "count", "total_ns").sort("name")
    assert ours.height > 0
    assert ours.equals(theirs)

    nvtx = (
        reports["nvtxkernsum"]
        .filter(pl.col("NVTX Range") != "None")
        .group_by(pl.col("NVTX Range").alias("range"), pl.col("PID").cast(pl.Int64).alias("pid"))
        .agg(pl.col("Total Time (ns)").cast(pl.Int64).sum().alias("kernel_ns"))
        .sort("range", "pid")
    )
    projected = (
        result.phases.filter((pl.col("attribution") == "projection") & (pl.col("kernel_ns") > 0))
        .with_columns(
            pl.when(pl.col("domain") != "")
            .then(pl.col("domain") + ":" + pl.col("phase"))
            .otherwise(pl.col("phase"))
            .alias("range")
        )
        .group_by("range", "pid")
        .agg(pl.col("kernel_ns").sum())
        .sort("range", "pid")
    )
    assert nvtx.height > 0
    assert projected.equals(nvtx)
