"""Composite jobs: what one ``nvtx-phases`` command does, as one typed function that prints nothing.

Each function runs a whole command's work (read or analyze a run, write its files, draw its
figures) and returns what the command shows: files written, tables, text. What happens meanwhile
goes to a :class:`Reporter` (notes worth keeping, stage texts, exports read); the default,
:data:`QUIET`, says nothing. Errors are the named classes of :mod:`analysis.errors`.

"An analysis folder or traces?" has one answer, :func:`analysis_folder`; :func:`open_run` reads
a run either way. Heavy imports (Polars, matplotlib, the pipeline) happen inside the functions,
so importing this module is cheap.
"""

from .capture import profile_workload, synthesize
from .common import QUIET, Reporter
from .lengths_dir import find_lengths
from .logs import LogsOutputs, logs_to
from .run import (
    AnalysisOutputs,
    analysis_folder,
    analyze_to,
    build_report,
    compare_to,
    is_analysis_folder,
    load_saved_analysis,
    open_run,
    resolve_traces,
)
from .timeline import TimelineOutputs, timeline_to
from .whatif import WhatIfOutputs, whatif_to
from .workload import LengthsOutputs, analyze_lengths, fidelity_to, fit_lengths

__all__ = [
    "QUIET",
    "AnalysisOutputs",
    "LengthsOutputs",
    "LogsOutputs",
    "Reporter",
    "TimelineOutputs",
    "WhatIfOutputs",
    "analysis_folder",
    "analyze_lengths",
    "analyze_to",
    "build_report",
    "compare_to",
    "fidelity_to",
    "find_lengths",
    "fit_lengths",
    "is_analysis_folder",
    "load_saved_analysis",
    "logs_to",
    "open_run",
    "profile_workload",
    "resolve_traces",
    "synthesize",
    "timeline_to",
    "whatif_to",
]
