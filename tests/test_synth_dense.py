"""The generator at kernel densities its ranges cannot hold at the usual launch pace."""

import sqlite3

from nvtx_phases.analysis.synth.build import SynthConfig, generate


def test_dense_phases_never_make_kernels_that_end_before_they_start(tmp_path):
    # 5,000 kernels per phase: 6 µs per launch no longer fits the short phases (the bench's
    # 1M-operation export once had two thirds of its kernels ending before they started)
    cfg = SynthConfig(steps=1, ranks=1, kernels_per_phase=5000, power=False, lengths=False)
    path = generate(tmp_path / "dense.sqlite", cfg, with_truth=False)[0]
    with sqlite3.connect(path) as con:
        n, n_backwards, shortest = con.execute(
            "SELECT COUNT(*), SUM(end < start), MIN(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()
        outside = con.execute(
            "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.start < "
            "(SELECT MIN(start) FROM NVTX_EVENTS)"
        ).fetchone()[0]
    assert n > 25_000
    assert n_backwards == 0
    assert shortest >= 0
    assert outside == 0
