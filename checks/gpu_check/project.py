"""The project's code this check reuses, imported here and only here.

Missing ``adbc_driver_sqlite`` and ``nvtx`` are stubbed first (:mod:`checks.gpu_check.stubs`):
``analysis.energy.samples`` pulls in the SQLite reader, the marking helpers import ``nvtx``, and a
bare GPU machine (system Python with torch, polars, pyarrow, rich, nvtx, nvidia-ml-py) may lack
either. If a refactor moves these functions, this module is the one to fix.
"""

from __future__ import annotations

from checks.gpu_check.stubs import stub_missing_adbc, stub_missing_nvtx

ADBC_STUBBED = stub_missing_adbc()
NVTX_STUBBED = stub_missing_nvtx()

from nvtx_phases.analysis.energy.samples import (  # noqa: E402
    PowerData,
    cumulative_energy,
    energy_at,
    interval_energy,
    load_samples,
)
from nvtx_phases.analysis.frames import int_value  # noqa: E402

from nvtx_phases.marking import phase, record_to, step  # noqa: E402
from nvtx_phases.power import PowerSampler  # noqa: E402

__all__ = [
    "ADBC_STUBBED",
    "NVTX_STUBBED",
    "PowerData",
    "PowerSampler",
    "cumulative_energy",
    "energy_at",
    "int_value",
    "interval_energy",
    "load_samples",
    "phase",
    "record_to",
    "step",
]
