"""Parallel reads (process pool, Ray) give exactly the sequential result."""

import os

import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import SPLIT_SAMPLE, assert_same_analysis


@pytest.fixture(scope="module")
def sequential():
    return analyze(SPLIT_SAMPLE, jobs=1)


def test_process_pool_equals_sequential(sequential):
    assert len(SPLIT_SAMPLE) == 3
    assert_same_analysis(analyze(SPLIT_SAMPLE, jobs=3, engine="process"), sequential)


def test_ray_tasks_equal_sequential(sequential):
    if os.environ.get("NVTX_PHASES_REQUIRE_VERL") != "1":
        pytest.importorskip("ray")
    import ray

    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        assert_same_analysis(analyze(SPLIT_SAMPLE, engine="ray"), sequential)
    finally:
        ray.shutdown()


def test_a_bad_file_in_the_pool_fails_with_its_name(tmp_path):
    from nvtx_phases.analysis.errors import TraceReadError

    bad = tmp_path / "broken.sqlite"
    bad.write_bytes(b"not sqlite at all")
    with pytest.raises(TraceReadError, match=r"broken\.sqlite"):
        analyze([*SPLIT_SAMPLE, bad], jobs=2)
