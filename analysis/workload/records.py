"""Which PolyTrace record kinds the paths given to ``lengths analyze`` hold, by file name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ..errors import InputError
from .dapo import DAPO_GLOB, dapo_steps, read_dapo_filter
from .lengths import PACKED_GLOB, REWARD_GLOB
from .multiturn import MULTITURN_GLOB, read_multiturn, samples, step_table

KNOWN = (PACKED_GLOB, REWARD_GLOB, MULTITURN_GLOB, DAPO_GLOB)
#: the kinds a folder needs one of (reward timings go with packed lengths, never alone)
PRIMARY = (PACKED_GLOB, MULTITURN_GLOB, DAPO_GLOB)


@dataclass(frozen=True)
class RecordFiles:
    """The files of each kind (sorted; empty where none)."""

    packed: list[Path]
    rewards: list[Path]
    multiturn: list[Path]
    dapo: list[Path]


def _of(paths: Sequence[Path], pattern: str) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob(pattern))
        elif path.match(pattern):
            found.append(path)
    return found


def record_files(paths: Sequence[str | Path]) -> RecordFiles:
    """The record files in ``paths`` (files or folders of them), by kind.

    An :class:`~analysis.errors.InputError` when a file named directly is of no known kind, or
    when nothing of any kind is there (reward timings alone do not count: they go with lengths).
    """
    given = [Path(p) for p in paths]
    for path in given:
        if path.is_file() and not any(path.match(p) for p in KNOWN):
            raise InputError(
                f"{path}: not a record file this command reads (names: {', '.join(KNOWN)})"
            )
    files = RecordFiles(*(_of(given, pattern) for pattern in KNOWN))
    if not (files.packed or files.multiturn or files.dapo):
        where = ", ".join(map(str, given))
        raise InputError(f"no {PACKED_GLOB}, {MULTITURN_GLOB} or {DAPO_GLOB} file in {where}")
    return files


def multiturn_step_table(paths: Sequence[str | Path]) -> pl.DataFrame | None:
    """``multiturn_steps.csv``'s table from the ``multiturn_workload_step_*.jsonl`` in ``paths``.

    ``paths``: record files or folders of them (others are ignored). One row per step: samples,
    turns per sample, tool vs engine latency, prefix-cache hit and loss-masked fractions,
    stragglers (definitions: :mod:`.multiturn`). None where there is no such file; a malformed one
    is a :class:`~analysis.errors.WorkloadInputError` naming it. Writes and prints nothing.
    """
    files = _of([Path(p) for p in paths], MULTITURN_GLOB)
    return step_table(samples(read_multiturn(files))) if files else None


def dapo_step_table(paths: Sequence[str | Path]) -> pl.DataFrame | None:
    """``dapo_steps.csv``'s table from the ``dapo_filter_indices*.jsonl`` in ``paths``.

    ``paths``: record files or folders of them (others are ignored). One row per trainer step:
    generation batches, prompts generated, kept and used, their ratios, ``batch_filled``
    (definitions: :mod:`.dapo`). None where there is no such file; a malformed one is a
    :class:`~analysis.errors.WorkloadInputError` naming it. Writes and prints nothing.
    """
    files = _of([Path(p) for p in paths], DAPO_GLOB)
    return dapo_steps(read_dapo_filter(files)) if files else None
