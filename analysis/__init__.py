"""Post-processing side of nvtx-phases: Nsight Systems SQLite exports → per-step, per-phase tables.

The public API (names load on first use, so ``import analysis.errors`` stays cheap)::

    from analysis import analyze, write_outputs, load_analysis

    with analyze(["rank0.sqlite", "rank1.sqlite"]) as result:
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
    from analysis.errors import (
        AnalysisError,
        MissingColumns,
        NotAnNsysExport,
        NothingToAnalyze,
        TraceReadError,
    )
    from analysis.model import PROJECTION, WINDOW, Analysis, RunSummary
    from analysis.render.files import load_analysis, write_outputs
    from analysis.run.pipeline import analyze

_EXPORTS = {
    "analyze": "analysis.run.pipeline",
    "write_outputs": "analysis.render.files",
    "load_analysis": "analysis.render.files",
    "Analysis": "analysis.model",
    "RunSummary": "analysis.model",
    "PROJECTION": "analysis.model",
    "WINDOW": "analysis.model",
    "AnalysisError": "analysis.errors",
    "MissingColumns": "analysis.errors",
    "NotAnNsysExport": "analysis.errors",
    "NothingToAnalyze": "analysis.errors",
    "TraceReadError": "analysis.errors",
}

__all__ = [
    "PROJECTION",
    "WINDOW",
    "Analysis",
    "AnalysisError",
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
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
