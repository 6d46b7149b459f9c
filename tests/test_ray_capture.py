"""A Ray-style capture (one export per process, every GPU seen as device 0, a trainer and a
rollout process sharing each GPU, CUDA graphs) against the generator's brute-force truth."""

from __future__ import annotations

import json

import polars as pl
import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray

METRICS = ("kernel_ns", "nccl_ns", "memcpy_ns", "memset_ns", "graph_ns", "gpu_busy_ns", "idle_ns")


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    files = generate_ray(folder, RayConfig())
    truth = json.loads((folder / "ground_truth.json").read_text())
    return analyze(files), truth


def test_gpus_are_physical_gpus(ray_run):
    result, truth = ray_run
    assert truth["n_devices"] == 2  # 4 GPU processes, 2 GPUs, all device 0
    assert result.summary.to_dict()["n_devices"] == 2
    assert [d["device"] for d in result.summary.to_dict()["devices"]] == [
        d["device"] for d in truth["devices"]
    ]
    assert [len(d["traces"]) for d in result.summary.to_dict()["devices"]] == [2, 2]
    assert {d["identity"] for d in result.summary.to_dict()["devices"]} == {"uuid"}


def test_totals_include_graph_time(ray_run):
    result, truth = ray_run
    s = result.summary.to_dict()
    for key in ("total_gpu_ns", "kernel_ns", "nccl_ns", "memcpy_ns", "memset_ns", "graph_ns"):
        assert s[key] == truth[key], key
    assert (s["n_kernels"], s["n_graphs"]) == (truth["n_kernels"], truth["n_graphs"])
    assert s["attributed_gpu_ns"] == truth["window_attributed_gpu_ns"]
    assert s["unattributed_gpu_ns"] == truth["window_unattributed_gpu_ns"]
    assert s["projection_attributed_gpu_ns"] == truth["projection_attributed_gpu_ns"]
    assert any("--cuda-graph-trace=node" in w for w in result.warnings)


def test_driver_phases_equal_truth(ray_run):
    result, truth = ray_run
    window = result.phases.filter(pl.col("attribution") == "window")
    got = {(r["step"], r["path"]): r for r in window.iter_rows(named=True)}
    assert len(got) == len(truth["driver_phases"])
    for expected in truth["driver_phases"]:
        row = got[(expected["step"], expected["path"])]
        assert row["n_devices"] == expected["n_devices"] == 2
        for metric in METRICS:
            assert row[metric] == expected[metric], (expected["path"], metric)


def test_busy_per_physical_gpu_is_one_union_over_processes(ray_run):
    result, truth = ray_run
    got = {
        (r["step"], r["path"], r["device"]): r["gpu_busy_ns"]
        for r in result.phase_devices.iter_rows(named=True)
    }
    for expected in truth["phase_devices"]:
        key = (expected["step"], expected["path"], expected["device"])
        assert got[key] == expected["gpu_busy_ns"], key


def test_conservation_from_the_phase_table(ray_run):
    """Σ top-level window phases' GPU time + unattributed (summed separately) = total."""
    result, _ = ray_run
    top = result.phases.filter((pl.col("attribution") == "window") & (pl.col("level") == 0))
    in_steps = sum(top[c].sum() for c in ("kernel_ns", "memcpy_ns", "memset_ns", "graph_ns"))
    assert (
        in_steps + result.summary.to_dict()["unattributed_gpu_ns"]
        == result.summary.to_dict()["total_gpu_ns"]
    )
    assert result.summary.to_dict()["gpu_time_conserved"] is True
