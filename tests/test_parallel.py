"""Parallel reads (process pool, Ray) give exactly the sequential result."""

import os

import pytest
from nvtxp_testkit import SAMPLES

from analysis.pipeline import analyze

SPLIT = sorted((SAMPLES / "grpo_synthetic_split").glob("*.sqlite"))


def assert_same(a, b):
    assert a.phases.equals(b.phases)
    assert a.phase_devices.equals(b.phase_devices)
    assert a.gpu_activity.equals(b.gpu_activity)
    assert a.kernels.equals(b.kernels)
    assert a.summary == b.summary


@pytest.fixture(scope="module")
def sequential():
    return analyze(SPLIT, jobs=1)


def test_process_pool_equals_sequential(sequential):
    assert len(SPLIT) == 3
    assert_same(analyze(SPLIT, jobs=3, engine="process"), sequential)


def test_ray_tasks_equal_sequential(sequential):
    if os.environ.get("NVTX_PHASES_REQUIRE_VERL") != "1":
        pytest.importorskip("ray")
    import ray

    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        assert_same(analyze(SPLIT, engine="ray"), sequential)
    finally:
        ray.shutdown()


def test_a_bad_file_in_the_pool_fails_with_its_name(tmp_path):
    from analysis.errors import TraceReadError

    bad = tmp_path / "broken.sqlite"
    bad.write_bytes(b"not sqlite at all")
    with pytest.raises(TraceReadError, match=r"broken\.sqlite"):
        analyze([*SPLIT, bad], jobs=2)
