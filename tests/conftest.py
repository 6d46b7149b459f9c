"""Shared fixtures (helpers live in nvtxp_testkit)."""

import pytest
from nvtxp_testkit import find_nsys_or_skip


@pytest.fixture(scope="session")
def nsys() -> str:
    """Path of the nsys CLI; skips (or fails in CI, NVTX_PHASES_REQUIRE_NSYS=1) without it."""
    return find_nsys_or_skip()
