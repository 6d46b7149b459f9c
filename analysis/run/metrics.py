"""GPU metrics per phase: nsys's GPU metric samples (``--gpu-metrics-devices``) over each phase.

Read from the run's exports after attribution (the samples are on each file's clock; the
attributed phases say which GPUs each row covers) and kept in the result, so the Python API
and every command write the same ``gpu_metrics_per_phase.csv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..aggregate.gpu_metrics import gpu_metrics_per_phase, projection_devices
from ..model import Analysis
from ..normalize.gpu_metrics import read_run_gpu_metrics


def with_gpu_metrics(result: Analysis, say: Callable[[str], None]) -> Analysis:
    """``result`` with ``gpu_metrics`` (None when no export holds GPU metrics) and notes.

    The notes say what the exports lack (no GPU metrics captured, GPUs they do not describe).
    """
    metrics = read_run_gpu_metrics(result.summary.traces)
    notes = (*result.notes, *metrics.notes)
    if metrics.available.is_empty():
        return dataclasses.replace(result, notes=notes)
    say("GPU metrics per phase")
    table = gpu_metrics_per_phase(
        result.phases,
        metrics.samples(),
        metrics.available,
        projection_devices(result.gpu_activity, result.phases),
    )
    return dataclasses.replace(result, gpu_metrics=None if table.is_empty() else table, notes=notes)
