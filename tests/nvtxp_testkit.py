"""Test helpers: paths to ../shared traces and the bundled samples, and the nsys lookup.

Named uniquely (not ``tests.…``): VeRL 0.9.1 installs a top-level ``tests`` package.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "traces_sample"
SHARED = Path(os.environ.get("NVTX_PHASES_SHARED", REPO.parent / "shared"))
TRACES = SHARED / "traces"


def shared_trace(name: str) -> Path:
    """A real export from ../shared/traces (CI has that folder; skip where it is absent)."""
    path = TRACES / name
    if not path.exists():
        if os.environ.get("NVTX_PHASES_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path} is required here (NVTX_PHASES_REQUIRE_SHARED=1) but missing")
        pytest.skip(f"{path} not present (set NVTX_PHASES_SHARED)")
    return path


def find_nsys_or_skip() -> str:
    """Path of the nsys CLI; skips (or fails in CI, NVTX_PHASES_REQUIRE_NSYS=1) without it."""
    found = shutil.which("nsys")
    if found is None:
        if os.environ.get("NVTX_PHASES_REQUIRE_NSYS") == "1":
            pytest.fail("nsys is required here (NVTX_PHASES_REQUIRE_NSYS=1) but not on PATH")
        pytest.skip("nsys not on PATH (install: bash ../shared/nsys/install-debian-nsys.sh)")
    return found


SPLIT_SAMPLE = sorted((SAMPLES / "grpo_synthetic_split").glob("*.sqlite"))


def assert_same_analysis(a, b, *, ignore_summary: tuple[str, ...] = ()) -> None:
    """Two :class:`~analysis.run.pipeline.Analysis` results hold the same frames and summary.

    ``b``'s GPU activity may be a lazy scan of per-bucket parts: its rows are compared in
    ``op_id`` order.
    """
    assert a.phases.equals(b.phases)
    assert a.phase_devices.equals(b.phase_devices)
    assert a.kernels.equals(b.kernels)
    assert a.steps.equals(b.steps)
    assert a.gpu_activity.equals(b.gpu_activity.lazy().collect().sort("op_id"))

    def kept(summary: dict) -> dict:
        return {k: v for k, v in summary.items() if k not in ignore_summary}

    assert kept(a.summary) == kept(b.summary)
