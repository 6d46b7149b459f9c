"""Post-processing side of nvtx-phases: Nsight Systems SQLite exports → per-step, per-phase tables.

The public API (names load on first use, so ``import nvtx_phases.analysis.errors`` stays cheap)::

    from nvtx_phases.analysis import analyze, write_outputs, load_analysis

    with analyze(["rank0.sqlite", "rank1.sqlite"], steps="2:") as result:
        result.phases                   # one row per phase range (Polars DataFrame)
        result.gpu_activity.collect()   # one row per GPU operation (a LazyFrame: may be big)
        result.summary.gpu.total_gpu_ns
        write_outputs(result, "out/run")

The stages, in the order ``analyze`` runs them, are packages: ``read`` (SQLite → Arrow → Polars),
``normalize`` (ranges, operations, devices, launch linking), ``run`` (per-file loading, clock
alignment, the pipeline), ``attribute`` (hierarchy, steps, projection and window), ``aggregate``
(phase, device, kernel and activity tables), ``energy``; then ``workload`` (lengths, stragglers,
fidelity, compare) and ``render`` (files, terminal, figures, report). ``synth`` is a fixture.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import (
        AnalysisError,
        MissingColumns,
        NotAnNsysExport,
        NothingToAnalyze,
        TraceReadError,
    )
    from .model import PROJECTION, WINDOW, Analysis, RunSummary
    from .options import AnalyzeOptions
    from .render.outputs.files import load_analysis, write_outputs
    from .run.pipeline import analyze

_EXPORTS = {
    "analyze": ".run.pipeline",
    "write_outputs": ".render.outputs.files",
    "load_analysis": ".render.outputs.files",
    "Analysis": ".model",
    "AnalyzeOptions": ".options",
    "RunSummary": ".model",
    "PROJECTION": ".model",
    "WINDOW": ".model",
    "AnalysisError": ".errors",
    "MissingColumns": ".errors",
    "NotAnNsysExport": ".errors",
    "NothingToAnalyze": ".errors",
    "TraceReadError": ".errors",
}

__all__ = [
    "PROJECTION",
    "WINDOW",
    "Analysis",
    "AnalysisError",
    "AnalyzeOptions",
    "MissingColumns",
    "NotAnNsysExport",
    "NothingToAnalyze",
    "RunSummary",
    "TraceReadError",
    "analyze",
    "load_analysis",
    "write_outputs",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
