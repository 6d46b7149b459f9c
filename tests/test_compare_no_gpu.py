"""``compare`` of a capture without GPUs: its GPU metrics are not available (null, "—"), never 0.

The CPU sample (``cpu_rl_step_nsys2022.4``: a real nsys capture of a CPU-only RL step, no GPU)
beside the synthetic GRPO sample; the GPU run's medians are checked against its ground truth
(the generator's own brute-force recount), not against the comparison's code.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from nvtx_phases.analysis.aggregate.steps import GPU_METRICS, STEP_METRICS
from nvtx_phases.analysis.render.outputs.compare_files import write_comparison
from nvtx_phases.analysis.render.report.document import phase_summary
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import SAMPLES

GPU_RUN = SAMPLES / "grpo_synthetic.sqlite"
CPU_RUN = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    with analyze([CPU_RUN]) as cpu, analyze([GPU_RUN]) as gpu:
        assert cpu.summary.n_devices == 0 and gpu.summary.n_devices == 2
        write_comparison({"cpu": cpu, "grpo": gpu}, out)
        yield out, cpu


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_cpu_run_gpu_metrics_are_null_in_the_csvs(compared):
    out, _ = compared
    rows = _rows(out / "compare.csv")
    cpu = [r for r in rows if r["run"] == "cpu"]
    assert cpu
    for r in cpu:
        if r["metric"] in GPU_METRICS:
            assert (r["median"], r["p10"], r["p90"]) == ("", "", ""), r
        else:
            assert r["metric"] == "wall_ms" and float(r["median"]) > 0
    # nothing to subtract the GPU run's values from: no difference, no ratio
    for r in rows:
        if r["run"] == "grpo" and r["metric"] in GPU_METRICS and r["median"]:
            assert (r["diff"], r["ratio"], r["diff_pct"]) == ("", "", ""), r
    steps = [r for r in _rows(out / "compare_steps.csv") if r["metric"] in GPU_METRICS]
    assert steps and all(r["value"] == "" for r in steps if r["run"] == "cpu")


def test_cpu_run_shows_no_zero_in_compare_md(compared):
    out, _ = compared
    md = (out / "compare.md").read_text(encoding="utf-8")
    assert "No GPU metrics for cpu: not available" in md
    titles = {f"### {label} ({unit})": metric for metric, (label, unit) in STEP_METRICS.items()}
    metric = None
    checked = 0
    for line in md.splitlines():
        if line.startswith("### "):
            metric = titles[line]
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if metric is None or not line.startswith("| ") or cells[0] == "phase path":
            continue
        if metric in GPU_METRICS:  # columns: path, scheme, cpu, grpo, ...
            assert cells[2] == "—", line
            checked += 1
    assert checked


def test_gpu_run_medians_equal_its_ground_truth(compared):
    out, _ = compared
    truth = json.loads((SAMPLES / "grpo_synthetic.ground_truth.json").read_text())
    got = {
        (r["path"], r["metric"]): float(r["median"])
        for r in _rows(out / "compare.csv")
        if r["run"] == "grpo" and r["attribution"] == "window" and r["median"]
    }
    columns = {  # compare's metric → the truth's column (ns or bytes: / 1e6 for ms or MB)
        "wall_ms": "wall_ns",
        "kernel_ms": "kernel_ns",
        "nccl_ms": "nccl_ns",
        "memcpy_ms": "memcpy_ns",
        "memcpy_mb": "memcpy_bytes",
    }
    paths = {p["path"] for p in truth["driver_phases"]}
    for path in paths:
        for metric, column in columns.items():
            values = [p[column] for p in truth["driver_phases"] if p["path"] == path]
            want = statistics.median(values) / 1e6
            assert got[(path, metric)] == pytest.approx(want, rel=1e-12), (path, metric)


def test_report_phase_summary_of_the_cpu_run_has_null_gpu_metrics(compared):
    _, cpu = compared
    summary = phase_summary(cpu)
    assert summary["wall_ms"].null_count() == 0
    for metric in GPU_METRICS:
        assert summary[metric].null_count() == summary.height, metric
