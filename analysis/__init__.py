"""Post-processing side of nvtx-phases: Nsight Systems SQLite exports → per-step, per-phase tables.

The pipeline is visible in the modules: ``reader`` (SQLite → Arrow → Polars), ``normalize``
(ids, names, kinds), ``loading`` (one file: read-ahead, ``launches`` linking, ``ops_store``
spilling), ``hierarchy`` (NVTX nesting and step index), ``attribute`` (GPU operations onto
ranges), ``run_attribution`` (a run, bucket by bucket), ``aggregate`` (phase table, kernel table,
summary) and ``render``/``figures``. ``pipeline.analyze`` chains them.
"""

from analysis.errors import AnalysisError, MissingColumns, NotAnNsysExport, TraceReadError

__all__ = ["AnalysisError", "MissingColumns", "NotAnNsysExport", "TraceReadError"]
