"""The provenance of an analysis: versions, command line, options, input files, time.

:func:`analysis.run.pipeline.analyze` records what it knows (its options, the traces, power
files and phase map it read); the CLI's jobs add the command line and their own options
(:func:`with_invocation`). It makes ``summary.json`` differ between two runs of the same
analysis (time, mtimes), by design.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from ..model import Analysis, InputFile, Provenance, tool_version
from ..options import AnalyzeOptions


def utc_iso(seconds: float) -> str:
    """A POSIX time as ISO 8601 UTC with milliseconds (``2026-05-01T12:00:00.123Z``)."""
    stamp = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def input_file(kind: str, path: str | Path) -> InputFile:
    """``path`` as read now: absolute path, size and mtime (None for both when unreadable)."""
    absolute = Path(path).absolute()
    try:
        info = absolute.stat()
    except OSError:
        return InputFile(kind, str(absolute), None, None)
    return InputFile(kind, str(absolute), info.st_size, utc_iso(info.st_mtime))


def started(traces: Sequence[Path], options: AnalyzeOptions) -> Provenance:
    """Provenance at the start of an analysis of ``traces`` with ``options`` (no power yet)."""
    return Provenance(
        tool_version=tool_version(),
        python_version=platform.python_version(),
        polars_version=pl.__version__,
        command_line=None,
        options=options.provenance(),
        inputs=[input_file("trace", p) for p in traces],
        analyzed_at_utc=utc_iso(datetime.now(timezone.utc).timestamp()),
    )


def finished(result: Analysis, provenance: Provenance, options: AnalyzeOptions) -> Analysis:
    """``result`` with ``provenance`` in its summary, its power and phase map files as inputs.

    The power files are those the analysis used; the phase map file, where the map came from one.
    """
    added = [input_file("power", p) for p in result.summary.power_files]
    if options.phase_map_file is not None:
        added.append(input_file("phase_map", options.phase_map_file))
    provenance = dataclasses.replace(provenance, inputs=[*provenance.inputs, *added])
    return dataclasses.replace(
        result, summary=dataclasses.replace(result.summary, provenance=provenance)
    )


def with_invocation(
    result: Analysis,
    *,
    command_line: Sequence[str] | None,
    options: Mapping[str, Any] | None = None,
) -> Analysis:
    """``result`` with the command line and a command's own options in its provenance.

    The new result shares ``result``'s temporary files: use (and close) only it.
    """
    provenance = result.summary.provenance
    if provenance is None:
        return result
    provenance = dataclasses.replace(
        provenance,
        command_line=list(command_line) if command_line is not None else None,
        options=provenance.options | dict(options or {}),
    )
    return dataclasses.replace(
        result, summary=dataclasses.replace(result.summary, provenance=provenance)
    )
