"""Studies: labelled runs with axes (policy, reward, task, hardware, n_gpus, …) in one tidy table.

A study file (TOML) lists runs; each ``[[run]]`` has ``path`` (or ``paths``), ``label`` and an
``axes`` table, optionally ``lengths`` and ``power``. Relative paths resolve against
the file's folder; nothing in the file is executed. :func:`parse_study` checks it (unknown keys,
missing paths, duplicate labels: one :class:`~analysis.errors.WorkloadInputError` line).

:func:`tidy_table` turns each run's per-step phase metrics (:func:`analysis.workload.compare.
run_metrics`, the same definitions ``compare`` uses) into one row per run × phase × metric with
the axes as columns. Only phases every compared run has are kept; runs sharing none of them with
the others are left out, each with its reason (:func:`shared_runs`).

The metrics come from one registry, :data:`STUDY_METRICS`. A new per-phase quantity (a helper's
``tokens_energy.csv`` or ``memory_by_phase.csv``) is one :class:`StudyMetric` entry naming its
source table and column, and a loader for that source in :data:`SOURCES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import tomllib

from nvtx_phases.naming import PATH_SEP, STEP

from ..aggregate.shares import share_over_steps, step_shares
from ..aggregate.steps import STEP_METRICS, over_steps
from ..errors import WorkloadInputError
from ..model import WINDOW, Analysis
from .compare import KEYS, run_metrics

#: the axes every study names (a run may add its own)
KNOWN_AXES = ("policy", "reward", "task", "hardware", "n_gpus")
#: the keys a ``[[run]]`` may have
RUN_KEYS = frozenset({"path", "paths", "label", "axes", "lengths", "power"})
#: the top-level keys of a study file
TOP_KEYS = frozenset({"title", "run"})


@dataclass(frozen=True)
class StudyMetric:
    """One quantity of the tidy table: its name, unit, definition and where it comes from."""

    name: str
    unit: str
    definition: str
    source: str  #: the table it is read from (``phase_steps``: analyze's per-step phase table)
    column: str


#: every metric of the tidy table, one entry each. ``phase_steps`` metrics are the medians over
#: steps of :data:`analysis.aggregate.steps.STEP_METRICS` (compare's definitions). To add e.g.
#: tokens per joule: ``StudyMetric("tokens_per_j", "tok/J", "…", "tokens_energy", "tokens_per_j")``
#: plus a ``SOURCES["tokens_energy"]`` loader returning ``path, attribution, <column>``.
STUDY_METRICS: tuple[StudyMetric, ...] = (
    *(
        StudyMetric(name, unit, f"{text}, median over steps", "phase_steps", name)
        for name, (text, unit) in STEP_METRICS.items()
    ),
    *(
        StudyMetric(
            f"{what}_share_pct",
            "%",
            f"the phase's {what} / its step's {what} × 100, median over steps",
            "step_shares",
            f"{what}_share_pct",
        )
        for what in ("time", "energy")
    ),
)

#: per source table, how to read ``path, attribution, n_steps`` + its metric columns from a run
Source = Callable[[str, Analysis], pl.DataFrame]


def _phase_steps(label: str, analysis: Analysis) -> pl.DataFrame:
    """Median per phase over steps (``n_steps`` null for a run without step ranges).

    A run without GPUs (a CPU capture) has only its wall times: its GPU figures are null
    (:func:`~analysis.workload.compare.run_metrics`, as in ``compare``).
    """
    per_step, whole = run_metrics(label, analysis)
    wide = over_steps(per_step)
    if whole:
        wide = wide.with_columns(pl.lit(None, dtype=pl.Int64).alias("n_steps"))
    return wide


def _step_shares(label: str, analysis: Analysis) -> pl.DataFrame:
    """The median over steps of each direct phase's share of its step (time and energy, %).

    :func:`analysis.aggregate.shares.step_shares` then ``share_over_steps``: the one definition
    of a share; rows under the attribution of the run's ``step`` rows.
    """
    phases = analysis.phases
    over = share_over_steps(step_shares(phases))
    steps = phases.filter(pl.col("path") == STEP)["attribution"].unique().sort()
    return over.select(
        (pl.lit(STEP + PATH_SEP) + pl.col("canonical")).alias("path"),
        pl.lit(steps[0] if steps.len() else WINDOW).alias("attribution"),
        "n_steps",
        pl.col("time_share_median").alias("time_share_pct"),
        pl.col("energy_share_median").alias("energy_share_pct"),
    )


SOURCES: dict[str, Source] = {"phase_steps": _phase_steps, "step_shares": _step_shares}


@dataclass(frozen=True)
class StudyRun:
    """One run of a study: its inputs, label and axes (values as the file gives them)."""

    label: str
    paths: tuple[Path, ...]
    axes: dict[str, str | int | float | bool]
    lengths: Path | None = None
    power: Path | None = None


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
        if ("path" in entry) == ("paths" in entry):
            raise WorkloadInputError(f"{where}: give exactly one of path or paths")
        raw = entry["paths"] if "paths" in entry else [entry["path"]]
        if not isinstance(raw, list) or not raw:
            raise WorkloadInputError(f"{where}: paths must be a non-empty list")
        axes = entry.get("axes", {})
        if not isinstance(axes, dict) or any(
            not isinstance(v, str | int | float | bool) for v in axes.values()
        ):
            raise WorkloadInputError(f"{where}: axes must be a table of plain values")
        optional = {
            k: _path(base, entry[k], f"{where} {k}") for k in ("lengths", "power") if k in entry
        }
        runs.append(
            StudyRun(
                label=label,
                paths=tuple(_path(base, p, where) for p in raw),
                axes=dict(axes),
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


def tidy_table(
    study: Study, analyses: Mapping[str, Analysis]
) -> tuple[pl.DataFrame, dict[str, str]]:
    """(tidy, left out): one row per run × phase × metric, with the axes as columns.

    Columns: ``run``, each axis (as a string), ``path, attribution, n_steps, metric, unit,
    value``. Only phases every kept run has are in it. Runs whose phases could not be read (no
    phases) or share none are left out with the reason.
    """
    left: dict[str, str] = {}
    wides: dict[str, dict[str, pl.DataFrame]] = {}
    for label, analysis in analyses.items():
        try:
            wides[label] = {name: load(label, analysis) for name, load in SOURCES.items()}
        except WorkloadInputError as exc:
            left[label] = str(exc)
    if not wides:
        raise WorkloadInputError("no run of the study has phases to compare")
    phases = {label: set(w["phase_steps"].select(KEYS).rows()) for label, w in wides.items()}
    kept, more = shared_runs(phases)
    left.update(more)
    common = set.intersection(*(phases[x] for x in kept))
    by_label = {r.label: r for r in study.runs}
    rows = []
    for label in kept:
        run = by_label[label]
        for metric in STUDY_METRICS:
            src = wides[label][metric.source]
            if metric.column not in src.columns:
                continue
            rows.append(
                src.filter(
                    pl.struct(KEYS).is_in(
                        pl.DataFrame(sorted(common), schema=KEYS, orient="row")
                        .to_struct()
                        .implode()
                    )
                ).select(
                    pl.lit(label).alias("run"),
                    *[
                        pl.lit(None if a not in run.axes else str(run.axes[a]), pl.String).alias(a)
                        for a in study.axes
                    ],
                    *KEYS,
                    pl.col("n_steps").cast(pl.Int64)
                    if "n_steps" in src.columns
                    else pl.lit(None, pl.Int64).alias("n_steps"),
                    pl.lit(metric.name).alias("metric"),
                    pl.lit(metric.unit).alias("unit"),
                    pl.col(metric.column).cast(pl.Float64).alias("value"),
                )
            )
    return pl.concat(rows), left
