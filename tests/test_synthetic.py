"""The synthetic GRPO run: analysis equals the generator's independent ground truth, exactly."""

import json

import polars as pl
import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtxp_testkit import SAMPLES
from polars.testing import assert_frame_equal

METRICS = [
    "wall_ns",
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "n_kernels",
    "gpu_busy_ns",
]
#: the ground truth's n_kernels counts operations starting inside a range: the phase table's
#: n_kernels_started (its n_kernels counts every kernel running inside a window range)
AS_TRUTH = [
    pl.col("n_kernels_started").alias("n_kernels") if m == "n_kernels" else m for m in METRICS
]


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "run.sqlite"
    generate(path, SynthConfig(steps=3, ranks=3, kernels_per_phase=24, seed=11))
    truth = json.loads(path.with_name("run.ground_truth.json").read_text())
    return analyze([path]), truth


def test_driver_phases_equal_ground_truth(combined):
    result, truth = combined
    expected = (
        pl.DataFrame(truth["driver_phases"]).select("step", "path", *METRICS).sort("step", "path")
    )
    got = (
        result.phases.filter(pl.col("attribution") == "window")
        .select("step", "path", *AS_TRUTH)
        .sort("step", "path")
    )
    assert_frame_equal(got, expected, check_dtypes=False)
    assert got.height == 3 * 8  # step + 7 phases, 3 steps


def test_worker_phases_equal_ground_truth(combined):
    result, truth = combined
    expected = (
        pl.DataFrame(truth["worker_phases"])
        .drop("start_ns", "end_ns")
        .group_by("pid", "step", "path")
        .agg(pl.col(m).sum() for m in METRICS)
        .sort("pid", "step", "path")
    )
    got = (
        result.phases.filter(pl.col("attribution") == "projection")
        .select("pid", "step", "path", *AS_TRUTH)
        .sort("pid", "step", "path")
    )
    assert_frame_equal(got, expected, check_dtypes=False)


def test_conservation_and_totals(combined):
    result, truth = combined
    s = result.summary.to_dict()
    assert s["total_gpu_ns"] == truth["total_gpu_ns"]
    assert s["attributed_gpu_ns"] == truth["window_attributed_gpu_ns"]
    assert s["unattributed_gpu_ns"] == truth["window_unattributed_gpu_ns"] == 3 * 4 * 100_000
    assert s["projection_attributed_gpu_ns"] == truth["projection_attributed_gpu_ns"]
    assert s["attributed_gpu_ns"] + s["unattributed_gpu_ns"] == s["total_gpu_ns"]
    assert s["n_gpu_ops"] == truth["n_gpu_ops"]
    assert s["n_steps"] == 3
    # gpu_activity: every op once; window pieces per op sum back to the op
    activity = result.gpu_activity.collect()
    assert activity.height == truth["n_gpu_ops"]
    assert activity["dur_ns"].sum() == truth["total_gpu_ns"]
    # the deliberately straddling generation kernels (rank 0, one per step) are split
    assert activity["window_split"].sum() == 3


def test_kernels_table_equals_ground_truth(combined):
    result, truth = combined
    expected = {name: (v["count"], v["total_ns"]) for name, v in truth["kernels"].items()}
    got = {
        row[0]: (row[1], row[2])
        for row in result.kernels.select("name", "count", "total_ns").rows()
    }
    assert got == expected


def test_per_device_window_rows_add_up(combined):
    result, _ = combined
    per_device = result.phase_devices.group_by("step", "path").agg(
        pl.col("gpu_busy_ns", "kernel_ns").sum()
    )
    window = result.phases.filter(pl.col("attribution") == "window").select(
        "step", "path", "gpu_busy_ns", "kernel_ns"
    )
    joined = window.join(per_device, on=["step", "path"], suffix="_dev")
    assert joined.height == window.height
    assert (joined["gpu_busy_ns"] == joined["gpu_busy_ns_dev"]).all()
    assert (joined["kernel_ns"] == joined["kernel_ns_dev"]).all()
    # reward and adv use no GPU: every device is idle for their whole wall time
    idle = result.phase_devices.filter(pl.col("path").is_in(["step/adv"]))
    assert (idle["idle_ns"] == idle["wall_ns"]).all()


def test_split_files_with_clock_offsets_equal_the_combined_file(tmp_path):
    cfg = SynthConfig(steps=2, ranks=2, kernels_per_phase=10, seed=3)
    one = analyze(generate(tmp_path / "one.sqlite", cfg))
    split_paths = generate(tmp_path / "split", SynthConfig(**{**cfg.__dict__, "split_files": True}))
    many = analyze(split_paths)
    offsets = [t["clock_offset_ns"] for t in many.summary.to_dict()["traces"]]
    assert offsets == [0, 3_000_000, 6_000_000]
    cols = ["pid", "step", "path", "attribution", "start_ns", *METRICS]
    assert_frame_equal(
        many.phases.select(cols).sort("pid", "step", "path"),
        one.phases.select(cols).sort("pid", "step", "path"),
    )
    assert many.summary.to_dict()["attributed_gpu_ns"] == one.summary.to_dict()["attributed_gpu_ns"]


def test_bundled_sample_matches_its_ground_truth_and_is_reproducible(tmp_path):
    sample = SAMPLES / "grpo_synthetic.sqlite"
    truth = json.loads((SAMPLES / "grpo_synthetic.ground_truth.json").read_text())
    result = analyze([sample])
    assert result.summary.to_dict()["total_gpu_ns"] == truth["total_gpu_ns"] == 257_892_636
    assert result.summary.to_dict()["attributed_gpu_ns"] == truth["window_attributed_gpu_ns"]
    generate(tmp_path / "again.sqlite", SynthConfig(**truth["config"]))
    again = json.loads((tmp_path / "again.ground_truth.json").read_text())
    assert again == truth
