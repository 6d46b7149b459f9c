"""Studies: labelled runs with axes (policy, reward, task, hardware, n_gpus, …) in one tidy table.

A study file (TOML) lists runs; each ``[[run]]`` has a ``label``, an ``axes`` table and its
inputs: ``path`` (or ``paths``: traces or an analysis folder), ``verl_log`` (one file or a list:
VeRL's console or file logs: tokens per step for a trace, or alone the run's phase timers and
logged memory), ``lengths`` (a folder of length, multi-turn or DAPO records; alone, a run of
records), ``power``, and for traces ``phase_map`` and ``all_ranges`` (as ``analyze``'s options).
At least one of path(s), verl_log, lengths. Relative paths resolve against
the file's folder; nothing in the file is executed. :func:`parse_study` checks it (unknown keys,
missing paths, duplicate labels: one :class:`~analysis.errors.WorkloadInputError` line).

:func:`tidy_table` turns each loaded run (:class:`~.study_sources.LoadedRun`) into one row per
run × phase × metric with the axes as columns, the metrics of :data:`~.study_sources.
STUDY_METRICS`. A phase is compared between the runs that have it: a phase only one run has is
left out of the table (:func:`compared_phases`), and a run sharing no phase with the others is
left out with its reason (:func:`shared_runs`); a run of records alone has run metrics only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import tomllib

from ..errors import WorkloadInputError
from .compare import KEYS
from .study_metrics import STUDY_METRICS
from .study_sources import SOURCES, TRACE, LoadedRun

#: the axes every study names (a run may add its own)
KNOWN_AXES = ("policy", "reward", "task", "hardware", "n_gpus")
#: the keys a ``[[run]]`` may have
RUN_KEYS = frozenset(
    {"path", "paths", "label", "axes", "lengths", "power", "verl_log", "phase_map", "all_ranges"}
)
#: the top-level keys of a study file
TOP_KEYS = frozenset({"title", "run"})


@dataclass(frozen=True)
class StudyRun:
    """One run of a study: its inputs, label and axes (values as the file gives them)."""

    label: str
    paths: tuple[Path, ...]  #: traces or an analysis folder; empty for a run of logs or records
    axes: dict[str, str | int | float | bool]
    lengths: Path | None = None
    power: Path | None = None
    verl_logs: tuple[Path, ...] = ()
    phase_map: Path | None = None  #: as ``analyze --phase-map``
    all_ranges: bool = False  #: as ``analyze --all-ranges``


@dataclass(frozen=True)
class Study:
    """A parsed study file."""

    title: str
    runs: tuple[StudyRun, ...]
    axes: tuple[str, ...] = field(default=())  #: every axis any run names, in first-seen order


def _path(base: Path, value: object, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise WorkloadInputError(f"{where}: a path must be a non-empty string, got {value!r}")
    path = (base / value).expanduser()
    if not path.exists():
        raise WorkloadInputError(f"{where}: {path} does not exist")
    return path


def _known_keys(where: str, table: Mapping[str, object], allowed: frozenset[str]) -> None:
    """Refuse keys of ``table`` outside ``allowed``, naming them (never accepted and ignored)."""
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise WorkloadInputError(
            f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})"
        )


def parse_study(file: Path) -> Study:
    """Read and check a study TOML; raise :class:`WorkloadInputError` (one line) when it is bad."""
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadInputError(f"{file}: cannot read ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadInputError(f"{file}: not valid TOML ({exc})") from exc
    _known_keys(str(file), data, TOP_KEYS)
    entries = data.get("run")
    if not isinstance(entries, list) or not entries:
        raise WorkloadInputError(f"{file}: no [[run]] entries")
    base = file.parent
    runs: list[StudyRun] = []
    for i, entry in enumerate(entries, 1):
        where = f"{file}: run {i}"
        if not isinstance(entry, dict):
            raise WorkloadInputError(f"{where}: must be a table ([[run]])")
        _known_keys(where, entry, RUN_KEYS)
        label = entry.get("label")
        if not isinstance(label, str) or not label:
            raise WorkloadInputError(f"{where}: needs a label (a non-empty string)")
        where = f"{file}: run {label!r}"
        if "path" in entry and "paths" in entry:
            raise WorkloadInputError(f"{where}: give one of path or paths, not both")
        if not ({"path", "paths", "verl_log", "lengths"} & set(entry)):
            raise WorkloadInputError(f"{where}: needs path, paths, verl_log or lengths")
        raw = entry["paths"] if "paths" in entry else [entry["path"]] if "path" in entry else []
        if not isinstance(raw, list) or ("paths" in entry and not raw):
            raise WorkloadInputError(f"{where}: paths must be a non-empty list")
        logs = entry.get("verl_log", [])
        logs = [logs] if isinstance(logs, str) else logs
        if not isinstance(logs, list) or ("verl_log" in entry and not logs):
            raise WorkloadInputError(f"{where}: verl_log must be a path or a non-empty list")
        axes = entry.get("axes", {})
        if not isinstance(axes, dict) or any(
            not isinstance(v, str | int | float | bool) for v in axes.values()
        ):
            raise WorkloadInputError(f"{where}: axes must be a table of plain values")
        for key in ("power", "phase_map", "all_ranges"):
            if key in entry and not raw:
                raise WorkloadInputError(f"{where}: {key} needs the run's traces (path or paths)")
        if not isinstance(entry.get("all_ranges", False), bool):
            raise WorkloadInputError(f"{where}: all_ranges must be true or false")
        optional: dict[str, Any] = {
            k: _path(base, entry[k], f"{where} {k}")
            for k in ("lengths", "power", "phase_map")
            if k in entry
        }
        if "all_ranges" in entry:
            optional["all_ranges"] = entry["all_ranges"]
        runs.append(
            StudyRun(
                label=label,
                paths=tuple(_path(base, p, where) for p in raw),
                axes=dict(axes),
                verl_logs=tuple(_path(base, p, f"{where} verl_log") for p in logs),
                **optional,
            )
        )
    labels = [r.label for r in runs]
    duplicates = sorted({x for x in labels if labels.count(x) > 1})
    if duplicates:
        raise WorkloadInputError(f"{file}: duplicate run label(s) {', '.join(duplicates)}")
    axes_seen: dict[str, None] = {}
    for r in runs:
        axes_seen.update(dict.fromkeys(r.axes))
    title = data.get("title", file.stem)
    return Study(title=str(title), runs=tuple(runs), axes=tuple(axes_seen))


def shared_runs(phases: Mapping[str, set[tuple[str, str]]]) -> tuple[list[str], dict[str, str]]:
    """(runs compared, {left-out run: why}): the largest group of runs sharing a phase set.

    The phases compared are those of the run whose phase set overlaps most runs; a run sharing
    none of them is left out. Comparing only shared phases keeps "per phase" the same phase.
    """
    labels = list(phases)

    def overlap(label: str) -> int:
        return sum(bool(phases[label] & phases[o]) for o in labels)

    anchor = max(labels, key=overlap)  # first in study order on ties
    kept = [x for x in labels if phases[x] & phases[anchor]]
    left = {
        x: f"shares no phase with {anchor} (it has {len(phases[x]):,} phase path(s))"
        for x in labels
        if x not in kept
    }
    return kept, left


def compared_phases(phases: Mapping[str, set[tuple[str, str]]]) -> set[tuple[str, str]]:
    """The phases (path, attribution) of two or more of ``phases``' runs; all of a lone run's."""
    if len(phases) == 1:
        return set(next(iter(phases.values())))
    seen: dict[tuple[str, str], int] = {}
    for keys in phases.values():
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
    return {key for key, n in seen.items() if n >= 2}


def _rows(
    study: Study, run: LoadedRun, frames: Mapping[str, pl.DataFrame], keep: set[tuple[str, str]]
) -> list[pl.DataFrame]:
    """The tidy rows of one run: each metric its source has, phase metrics on ``keep`` only."""
    axes = next(r.axes for r in study.runs if r.label == run.label)
    kept = pl.DataFrame(sorted(keep), schema=KEYS, orient="row").to_struct().implode()
    rows = []
    for metric in STUDY_METRICS:
        src = frames.get(metric.source)
        if src is None or metric.column not in src.columns:
            continue
        if metric.scope == "phase":
            src = src.filter(pl.struct(KEYS).is_in(kept))
        rows.append(
            src.select(
                pl.lit(run.label).alias("run"),
                *[
                    pl.lit(None if a not in axes else str(axes[a]), pl.String).alias(a)
                    for a in study.axes
                ],
                *KEYS,
                pl.col("n_steps").cast(pl.Int64)
                if "n_steps" in src.columns
                else pl.lit(None, pl.Int64).alias("n_steps"),
                pl.lit(metric.name).alias("metric"),
                pl.lit(metric.unit).alias("unit"),
                pl.col(metric.column).cast(pl.Float64).alias("value"),
                pl.col("input") if "input" in src.columns else pl.lit(TRACE).alias("input"),
            )
        )
    return rows


def tidy_table(study: Study, runs: Mapping[str, LoadedRun]) -> tuple[pl.DataFrame, dict[str, str]]:
    """(tidy, left out): one row per run × phase × metric, with the axes as columns.

    Columns: ``run``, each axis (as a string), ``path, attribution, n_steps, metric, unit,
    value, input`` (``trace``, ``verl_log`` or ``records``: what the value was read from). Phase metrics of the phases two or more kept runs have (:func:`compared_phases`);
    run metrics of every run. Runs whose phases could not be read, or that share none with
    the others, are left out with the reason.
    """
    left: dict[str, str] = {}
    frames: dict[str, dict[str, pl.DataFrame]] = {}
    for label, run in runs.items():
        try:
            loaded = {name: load(run) for name, load in SOURCES.items()}
        except WorkloadInputError as exc:
            left[label] = str(exc)
            continue
        frames[label] = {k: v for k, v in loaded.items() if v is not None}
    with_phases = {
        label: set(f["phase_steps"].select(KEYS).rows())
        for label, f in frames.items()
        if "phase_steps" in f
    }
    kept, more = shared_runs(with_phases) if with_phases else ([], {})
    left.update(more)
    keep = compared_phases({x: with_phases[x] for x in kept}) if kept else set()
    rows = [
        part
        for label in frames
        if label not in left
        for part in _rows(study, runs[label], frames[label], keep)
    ]
    if not rows:
        why = "; ".join(f"{k}: {v}" for k, v in left.items())
        raise WorkloadInputError(
            "no run of the study has phases or records to compare" + (f" ({why})" if why else "")
        )
    return pl.concat(rows), left
