"""The provenance of an analysis: versions, command line, options, input files, time.

:func:`analysis.run.pipeline.analyze` records what it knows (its options, the traces and power
files it read); the CLI's jobs add the command line and their own options
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

from ..attribute.phase_map import PhaseMap, default_phase_map
from ..model import Analysis, InputFile, Provenance, tool_version


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


def started(traces: Sequence[Path], options: Mapping[str, Any]) -> Provenance:
    """Provenance at the start of an analysis of ``traces`` with ``options`` (no power yet)."""
    return Provenance(
        tool_version=tool_version(),
        python_version=platform.python_version(),
        polars_version=pl.__version__,
        command_line=None,
        options=dict(options),
        inputs=[input_file("trace", p) for p in traces],
        analyzed_at_utc=utc_iso(datetime.now(timezone.utc).timestamp()),
    )


def analyze_options(
    *,
    phase_map: PhaseMap,
    power_files: Sequence[str | Path] | None,
    idle_power_w: float | None,
    jobs: int,
    engine: str,
    chunk_ops: int,
    spill_dir: str | Path | None,
    force_combine: bool,
) -> dict[str, Any]:
    """``analyze``'s options as JSON values (see :class:`analysis.model.Provenance`).

    ``phase_map`` is recorded as None when it is the default map (with or without
    ``all_ranges``), else as ``"custom"`` (a caller that read it from a file says which, see
    :func:`with_invocation`).
    """
    default = dataclasses.replace(phase_map, all_ranges=False) == default_phase_map()
    return {
        "phase_map": None if default else "custom",
        "all_ranges": phase_map.all_ranges,
        "power_files": None
        if power_files is None
        else [str(Path(p).absolute()) for p in power_files],
        "idle_power_w": idle_power_w,
        "jobs": jobs,
        "engine": engine,
        "chunk_ops": chunk_ops,
        "spill_dir": None if spill_dir is None else str(Path(spill_dir).absolute()),
        "force_combine": force_combine,
    }


def finished(result: Analysis, provenance: Provenance) -> Analysis:
    """``result`` with ``provenance`` in its summary, the power files it used among the inputs."""
    power = [input_file("power", p) for p in result.summary.power_files]
    provenance = dataclasses.replace(provenance, inputs=[*provenance.inputs, *power])
    return dataclasses.replace(
        result, summary=dataclasses.replace(result.summary, provenance=provenance)
    )


def with_invocation(
    result: Analysis,
    *,
    command_line: Sequence[str] | None,
    options: Mapping[str, Any] | None = None,
    phase_map_file: str | Path | None = None,
) -> Analysis:
    """``result`` with the command line and a command's own options in its provenance.

    ``phase_map_file``: the TOML file the phase map came from (recorded as an option and an
    input). The new result shares ``result``'s temporary files: use (and close) only it.
    """
    provenance = result.summary.provenance
    if provenance is None:
        return result
    extra = dict(options or {})
    inputs = list(provenance.inputs)
    if phase_map_file is not None:
        map_file = input_file("phase_map", phase_map_file)
        extra["phase_map"] = map_file.path
        inputs.append(map_file)
    provenance = dataclasses.replace(
        provenance,
        command_line=list(command_line) if command_line is not None else None,
        options=provenance.options | extra,
        inputs=inputs,
    )
    return dataclasses.replace(
        result, summary=dataclasses.replace(result.summary, provenance=provenance)
    )
