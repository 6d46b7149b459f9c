"""NVTX phase ranges → a hierarchy per thread (level, parent, path) and a step index per range.

Nesting rule (explicit, tested): on one thread, a range's level is the number of ranges open when
it starts; its parent is the last range of the level above that started before it. Push/pop
ranges always nest this way; start/end ranges that overlap without nesting are counted in a
warning. Ranges that start together nest longest-first; identical intervals nest
``step`` first, then by name (a fixed rule, so results never depend on row order).

Step rule: a range's step is its integer NVTX payload when it has one. Otherwise it comes from
the ``step`` ranges of its own process (trace, pid) when that process marks steps: the step range
of that process, on any of its threads, that encloses the range's start (precisely: the one that
started last at or before it, if still open then; overlapping steps of one process are warned). Two processes that each mark their own steps
(torchrun ranks, numbered 0, 1, … each) therefore never mix, however their steps are staggered in
time. Only a process with no step range of its own (VeRL's workers, which never see the step
number; its driver does) takes the step whose window, over all processes of the run, contains
the range's start. ``step`` ranges without payload are numbered 0, 1, … in start order per
process; a step's window spans that index's step ranges in every process.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nvtx_phases.naming import PATH_SEP, VERSION

from ..frames import int_value
from ..intervals import overlaps_earlier, reach, window_at
from ..model import THREAD
from .phase_map import PhaseMap

PROCESS = ("trace", "pid")


@dataclass
class Hierarchy:
    """Phase ranges with ``rid, level, parent_rid, path, canonical, is_step, step``."""

    phases: pl.DataFrame
    #: One row per step index: ``step, step_start_ns, step_end_ns`` (union over processes).
    steps: pl.DataFrame
    warnings: list[str]


def select_phases(ranges: pl.DataFrame, phase_map: PhaseMap) -> pl.DataFrame:
    """The ranges that are phases, with ``canonical`` and a row id in thread/start order.

    ``name`` is the name as the map reads it (:meth:`PhaseMap.name`: argument suffixes cut).
    """
    # Ties: identical intervals nest step-first, then by name and payload, so that nesting never
    # depends on the order rows come in (found by the property tests).
    return (
        ranges.with_columns(phase_map.name(pl.col("name")).alias("name"))
        .filter(phase_map.is_phase(pl.col("name"), pl.col("domain")))
        .with_columns(phase_map.canonical(pl.col("name")).alias("canonical"))
        .with_columns(phase_map.is_step(pl.col("canonical")).alias("_step_first"))
        .sort(
            [*THREAD, "start_ns", "end_ns", "_step_first", "name", "domain", "payload"],
            descending=[False, False, False, True, True, False, False, False],
            nulls_last=True,
        )
        .drop("_step_first")
        .with_row_index("rid")
        .with_columns(pl.col("rid").cast(pl.Int64))
    )


def nesting_levels(phases: pl.DataFrame) -> pl.DataFrame:
    """Level of every range: how many ranges on its thread are open when it starts."""
    starts = phases.select(
        "rid",
        *THREAD,
        pl.col("start_ns").alias("t"),
        pl.lit(1).alias("order"),
        pl.lit(1).alias("delta"),
    )
    # At one instant, ranges that end close before ranges that start (siblings, not nested),
    # except a zero-length range, whose end must follow its own start.
    ends = phases.select(
        "rid",
        *THREAD,
        pl.col("end_ns").alias("t"),
        pl.when(pl.col("end_ns") == pl.col("start_ns")).then(2).otherwise(0).alias("order"),
        pl.lit(-1).alias("delta"),
    )
    events = pl.concat([starts, ends]).sort([*THREAD, "t", "order", "rid"])
    events = events.with_columns(
        (pl.col("delta").cum_sum().over(list(THREAD)) - pl.col("delta")).alias("level")
    )
    levels = events.filter(pl.col("delta") == 1).select("rid", pl.col("level").cast(pl.Int32))
    return phases.join(levels, on="rid", how="left")


def parents(phases: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Add ``parent_rid``; also return how many ranges are not contained in their parent."""
    children = phases.with_columns((pl.col("level") - 1).alias("parent_level"))
    candidates = phases.select(
        pl.col("rid").alias("parent_rid"),
        *THREAD,
        pl.col("level").alias("parent_level"),
        pl.col("end_ns").alias("parent_end_ns"),
    )
    joined = children.join_asof(
        candidates,
        left_on="rid",
        right_on="parent_rid",
        by=[*THREAD, "parent_level"],
        strategy="backward",
        allow_exact_matches=False,
        check_sortedness=False,  # both sides are sorted by rid, the row id assigned in order
    )
    misnested = joined.filter(
        pl.col("parent_rid").is_not_null() & (pl.col("end_ns") > pl.col("parent_end_ns"))
    ).height
    return joined.drop("parent_level", "parent_end_ns"), misnested


def paths(phases: pl.DataFrame) -> pl.DataFrame:
    """Add ``path``: canonical names from the outermost range down, joined by ``/``."""
    max_level = int_value(phases["level"].max()) if phases.height else 0
    known = phases.filter(pl.col("level") == 0).select("rid", pl.col("canonical").alias("path"))
    done = [known]
    for level in range(1, max_level + 1):
        layer = (
            phases.filter(pl.col("level") == level)
            .select("rid", "parent_rid", "canonical")
            .join(
                known.rename({"rid": "parent_rid", "path": "parent_path"}),
                on="parent_rid",
                how="left",
            )
            .select("rid", (pl.col("parent_path") + PATH_SEP + pl.col("canonical")).alias("path"))
        )
        done.append(layer)
        known = layer
    return phases.join(pl.concat(done), on="rid", how="left")


def step_windows(phases: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every ``step`` range with its step index, and one window per step index.

    The first frame has ``rid, trace, pid, start_ns, end_ns, step`` for each step range (its
    payload, else its rank in start order within its process); the second ``step,
    step_start_ns, step_end_ns``, the union of that index's step ranges over all processes.
    """
    marked = phases.filter(pl.col("is_step")).with_columns(
        pl.coalesce(
            "payload",
            pl.col("start_ns").rank("ordinal").over(PROCESS).cast(pl.Int64) - 1,
        ).alias("step")
    )
    windows = (
        marked.group_by("step")
        .agg(
            pl.col("start_ns").min().alias("step_start_ns"),
            pl.col("end_ns").max().alias("step_end_ns"),
        )
        .sort("step_start_ns", "step")
    )
    return marked.select("rid", *PROCESS, "start_ns", "end_ns", "step"), windows


def overlapping_steps(marked: pl.DataFrame) -> pl.DataFrame:
    """Step ranges that start before an earlier step range of the same process has ended.

    Steps of different processes overlapping in time are normal (every rank runs its own step
    0, 1, …) and are not returned.
    """
    return marked.sort(*PROCESS, "start_ns", "end_ns", "rid").filter(overlaps_earlier(PROCESS))


def assign_steps(phases: pl.DataFrame, marked: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Step of each range: its own step range's index, its payload, else a step of its process.

    Returns ``rid, step, by_window`` for every range of ``phases``. A range without payload in
    a process that has step ranges (``marked``, from :func:`step_windows`) takes the index of the
    step range of that process that encloses its start (the one of that process that started
    last at or before it, if still open then); a range of a process without step ranges takes the
    step whose window (``windows``) contains its start (the window that started last at or before
    it, if still open then; ``by_window`` is then true).
    """
    own = marked.select(
        *PROCESS,
        pl.col("start_ns").alias("own_start_ns"),
        pl.col("end_ns").alias("own_end_ns"),
        pl.col("step").alias("own_step"),
    ).sort("own_start_ns")
    with_steps = marked.select(*PROCESS).unique().with_columns(pl.lit(True).alias("has_steps"))
    located = (
        phases.select("rid", *PROCESS, "start_ns", "payload", "step")
        .sort("start_ns")
        .join_asof(
            own,
            left_on="start_ns",
            right_on="own_start_ns",
            by=list(PROCESS),
            strategy="backward",
            check_sortedness=False,  # both sides sorted by time, so within each process too
        )
        .join(with_steps, on=list(PROCESS), how="left")
    )
    located = located.with_columns(
        window_at(windows.sort("step_start_ns", "step"), located["start_ns"]).alias("window_step")
    )
    in_own = pl.when(pl.col("start_ns") < pl.col("own_end_ns")).then(pl.col("own_step"))
    in_window = pl.col("window_step")
    by_window = (
        pl.col("step").is_null() & pl.col("payload").is_null() & pl.col("has_steps").is_null()
    )
    return located.select(
        "rid",
        pl.coalesce(
            "step",
            "payload",
            pl.when(pl.col("has_steps").is_not_null()).then(in_own).otherwise(in_window),
        ).alias("step"),
        (by_window & in_window.is_not_null()).alias("by_window"),
    )


def _process_list(frame: pl.DataFrame, limit: int = 3) -> str:
    """``trace T pid P: step S, …`` for the first processes of ``frame`` (step ranges)."""
    parts: list[str] = []
    for (trace, pid), rows in frame.group_by(*PROCESS, maintain_order=True):
        if len(parts) == limit:
            parts.append("…")
            break
        steps = ", ".join(str(s) for s in rows["step"].head(3).to_list())
        parts.append(f"trace {trace} pid {pid}: step {steps}{'…' if rows.height > 3 else ''}")
    return "; ".join(parts)


def build_hierarchy(
    ranges: pl.DataFrame, phase_map: PhaseMap, *, groups: pl.DataFrame | None = None
) -> Hierarchy:
    """Phases with nesting, path and step index, plus the step windows of the run.

    ``groups`` (``trace, pid, pool``: a run with GPU pools): a range of a process without step
    ranges of its own takes its step from the step-like ranges (``step``, or the rollouter's
    ``version``) of its own pool's processes, where that pool has any; a trainer's steps and a
    rollouter's parameter versions are separate axes.
    """
    warnings: list[str] = []
    phases = select_phases(ranges, phase_map)
    phases = nesting_levels(phases)
    phases, misnested = parents(phases)
    if misnested:
        warnings.append(
            f"{misnested} phase range(s) overlap a range of the level above without being "
            "inside it (start/end ranges that do not nest); they are counted under that range"
        )
    phases = paths(phases)
    phases = phases.with_columns(phase_map.is_step(pl.col("canonical")).alias("is_step"))
    marked, windows = step_windows(phases)
    phases = phases.join(marked.select("rid", "step"), on="rid", how="left")
    overlapping = overlapping_steps(marked)
    if overlapping.height:
        warnings.append(
            f"{overlapping.height} step(s) start before the previous step ends, within one "
            f"process ({_process_list(overlapping)}); ranges of that process in the overlap "
            "count toward the later step"
        )
    steps = assign_steps(phases, marked, windows)
    if groups is not None:
        steps = _steps_by_pool(phases, steps, groups)
    phases = phases.drop("step").join(steps, on="rid", how="left").sort("rid")
    ambiguous = _in_overlapping_windows(phases.filter(pl.col("by_window")), windows)
    if ambiguous:
        warnings.append(
            f"{ambiguous} phase range(s) of processes without step ranges start where the time "
            "windows of two steps overlap (steps of different processes staggered in time); "
            "each counts toward the step that started last"
        )
    phases = phases.drop("by_window")
    # A range's step ends where its process's step range of that index ends; for processes
    # without step ranges, where the step's window (over all processes) ends.
    own_ends = marked.group_by(*PROCESS, "step").agg(pl.col("end_ns").max().alias("own_end_ns"))
    crossing = (
        phases.filter(~pl.col("is_step"))
        .join(windows, on="step", how="inner")
        .join(own_ends, on=[*PROCESS, "step"], how="left")
        .filter(
            pl.col("end_ns") > pl.coalesce("own_end_ns", "step_end_ns")
            # with pools, a process without step ranges has its own pool's steps (versions)
            if groups is None
            else pl.col("end_ns") > pl.col("own_end_ns")
        )
        .height
    )
    if crossing:
        warnings.append(
            f"{crossing} phase range(s) run past the end of their step; each counts in the step "
            "it starts in"
        )
    if phases.height and phase_map.step_names and not phases["is_step"].any():
        warnings.append(
            "no step range found (names: "
            + ", ".join(sorted(phase_map.step_names))
            + "); phases have no step index unless their NVTX payload carries one"
        )
    return Hierarchy(phases=phases, steps=windows, warnings=warnings)


def _in_overlapping_windows(located: pl.DataFrame, windows: pl.DataFrame) -> int:
    """How many of these ranges start inside two or more step windows at once."""
    if not located.height or windows.height < 2:
        return 0
    earlier_end = windows.sort("step_start_ns", "step").select(
        "step_start_ns",
        reach(end="step_end_ns").alias("earlier_end_ns"),
    )
    return (
        located.sort("start_ns")
        .join_asof(earlier_end, left_on="start_ns", right_on="step_start_ns", strategy="backward")
        .filter(pl.col("start_ns") < pl.col("earlier_end_ns"))
        .height
    )


def _steps_by_pool(phases: pl.DataFrame, steps: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (``rid, step, by_window``) with by-window steps taken from the range's own pool.

    A pool's windows: the step-like ranges (``is_step``, or named :data:`VERSION`) of its
    processes, numbered by payload, else by start order per process, one window per index.
    Ranges of a process in no pool, or of a pool without step-like ranges, keep the run's.
    """
    pooled = phases.join(groups, on=list(PROCESS), how="inner")
    like = pooled.filter(pl.col("is_step") | (pl.col("canonical") == VERSION)).with_columns(
        pl.coalesce(
            "payload", pl.col("start_ns").rank("ordinal").over(PROCESS).cast(pl.Int64) - 1
        ).alias("_index")
    )
    if like.is_empty():
        return steps
    fixed: list[pl.DataFrame] = []
    for (pool,), mine in like.group_by("pool", maintain_order=True):
        windows = (
            mine.group_by("_index")
            .agg(
                pl.col("start_ns").min().alias("step_start_ns"),
                pl.col("end_ns").max().alias("step_end_ns"),
            )
            .rename({"_index": "step"})
            .sort("step_start_ns", "step")
        )
        located = (
            pooled.filter(pl.col("pool") == pool)
            .select("rid", "start_ns")
            .join(steps.filter(pl.col("by_window")).select("rid"), on="rid")
        )
        if located.height:
            fixed.append(
                located.select("rid", window_at(windows, located["start_ns"]).alias("_pool_step"))
            )
    if not fixed:
        return steps
    return (
        steps.join(pl.concat(fixed), on="rid", how="left")
        .with_columns(
            pl.when(pl.col("by_window") & pl.col("rid").is_in(pl.concat(fixed)["rid"].implode()))
            .then(pl.col("_pool_step"))
            .otherwise(pl.col("step"))
            .alias("step")
        )
        .drop("_pool_step")
    )
