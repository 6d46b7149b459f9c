"""Where a run's response-length records are: beside its inputs, or beside its traces."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model import Analysis


def find_lengths(
    inputs: Sequence[Path], patterns: Sequence[str] = ("packed_lengths_step_*.jsonl",)
) -> Path | None:
    """A folder of record files beside the inputs, if any: packed_lengths files by default.

    ``patterns``: the file names that count (the report also takes multi-turn and DAPO records).
    """
    for path in inputs:
        for candidate in (
            path.with_name(path.stem + "_lengths"),
            path / "lengths",
            path.parent / "lengths",
        ):
            if candidate.is_dir() and any(any(candidate.glob(p)) for p in patterns):
                return candidate
    return None


def traces_read(analysis: Analysis) -> list[Path]:
    """The trace files ``analysis`` was made from: as read (absolute), else as named."""
    provenance = analysis.summary.provenance
    read = [Path(f.path) for f in provenance.inputs if f.kind == "trace"] if provenance else []
    return read or [Path(t.path) for t in analysis.summary.traces]


def lengths_beside(inputs: Sequence[Path], analysis: Analysis) -> Path | None:
    """:func:`find_lengths` beside the inputs, else beside the traces ``analysis`` came from.

    An analysis folder's records stay beside its traces, not in the folder. Any record kind the
    report reads counts: packed lengths, multi-turn, DAPO filter.
    """
    from ..workload.records import PRIMARY

    return find_lengths(inputs, PRIMARY) or find_lengths(traces_read(analysis), PRIMARY)
