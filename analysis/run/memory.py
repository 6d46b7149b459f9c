"""Memory per phase: the run's device memory events over each phase row (``memory_per_phase.csv``).

Read from the run's files after attribution, like the GPU metrics (:mod:`analysis.run.metrics`),
and kept in the result, so the Python API and every command write the same table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..aggregate.gpu_metrics import projection_devices
from ..aggregate.memory import copies_of, memory_per_phase
from ..model import Analysis
from ..normalize.memory import read_run_memory_events


def with_memory(result: Analysis, say: Callable[[str], None]) -> Analysis:
    """``result`` with ``memory`` (None, and a note naming the missing table, without events)."""
    events, found = read_run_memory_events(result.summary.traces)
    notes = (*result.notes, *found)
    if events.is_empty():
        return dataclasses.replace(result, notes=notes)
    say("device memory per phase")
    table = memory_per_phase(
        result.phases,
        events,
        projection_devices(result.gpu_activity, result.phases),
        copies_of(result.gpu_activity),
    )
    return dataclasses.replace(result, memory=None if table.is_empty() else table, notes=notes)
