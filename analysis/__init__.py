"""Post-processing side of nvtx-phases: Nsight Systems SQLite exports → per-step, per-phase tables.

The pipeline is visible in the modules: ``reader`` (SQLite → Arrow → Polars), ``normalize``
(ids, names, kinds), ``hierarchy`` (NVTX nesting and step index), ``attribute`` (GPU operations
onto ranges), ``aggregate`` (phase table, kernel table, summary) and ``render``/``figures``.
``pipeline.analyze`` chains them and writes the outputs.
"""

from analysis.errors import AnalysisError, MissingColumns, NotAnNsysExport, TraceReadError

__all__ = ["AnalysisError", "MissingColumns", "NotAnNsysExport", "TraceReadError"]
