"""NVTX phase ranges → a hierarchy per thread (level, parent, path) and a step index per range.

Nesting rule (explicit, tested): on one thread, a range's level is the number of ranges open when
it starts; its parent is the last range of the level above that started before it. Push/pop
ranges always nest this way; start/end ranges that overlap without nesting are counted in a
warning. Ranges that start together nest longest-first; identical intervals nest
``step`` first, then by name (a fixed rule, so results never depend on row order).

Step rule: a range's step is its integer NVTX payload when it has one; otherwise the index of the
``step`` range that encloses its start in time, in any process of the run (VeRL's workers never
see the step number, its driver does). ``step`` ranges without payload are numbered 0, 1, … in
start order per process.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.phase_map import PhaseMap
from nvtx_phases.naming import PATH_SEP

THREAD = ("trace", "gtid")


@dataclass
class Hierarchy:
    """Phase ranges with ``rid, level, parent_rid, path, canonical, is_step, step``."""

    phases: pl.DataFrame
    #: One row per step index: ``step, step_start_ns, step_end_ns`` (union over processes).
    steps: pl.DataFrame
    warnings: list[str]


def select_phases(ranges: pl.DataFrame, phase_map: PhaseMap) -> pl.DataFrame:
    """The ranges that are phases, with ``canonical`` and a row id in thread/start order."""
    # Ties: identical intervals nest step-first, then by name and payload, so that nesting never
    # depends on the order rows come in (found by the property tests).
    return (
        ranges.filter(phase_map.is_phase(pl.col("name"), pl.col("domain")))
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
    max_level = phases["level"].max() if phases.height else 0
    known = phases.filter(pl.col("level") == 0).select("rid", pl.col("canonical").alias("path"))
    done = [known]
    for level in range(1, (max_level or 0) + 1):
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
    """Step index of every ``step`` range, and one window per step index."""
    marked = phases.filter(pl.col("is_step")).with_columns(
        pl.coalesce(
            "payload",
            pl.col("start_ns").rank("ordinal").over("trace", "pid").cast(pl.Int64) - 1,
        ).alias("step")
    )
    windows = (
        marked.group_by("step")
        .agg(
            pl.col("start_ns").min().alias("step_start_ns"),
            pl.col("end_ns").max().alias("step_end_ns"),
        )
        .sort("step_start_ns")
    )
    return marked.select("rid", "step"), windows


def assign_steps(phases: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Step of each range: its payload, else the step window that contains its start."""
    by_time = phases.sort("start_ns")
    located = by_time.join_asof(
        windows, left_on="start_ns", right_on="step_start_ns", strategy="backward"
    ).with_columns(
        pl.when(pl.col("start_ns") < pl.col("step_end_ns"))
        .then(pl.col("step_right"))
        .alias("in_window")
    )
    return located.select(
        "rid",
        pl.coalesce("step", "payload", "in_window").alias("step"),
    )


def build_hierarchy(ranges: pl.DataFrame, phase_map: PhaseMap) -> Hierarchy:
    """Phases with nesting, path and step index, plus the step windows of the run."""
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
    step_of_steps, windows = step_windows(phases)
    phases = phases.join(step_of_steps, on="rid", how="left")
    overlapping = windows.filter(pl.col("step_start_ns") < pl.col("step_end_ns").shift(1))
    if overlapping.height:
        steps = ", ".join(str(s) for s in overlapping["step"].head(5).to_list())
        warnings.append(
            f"{overlapping.height} step(s) start before the previous step ends (step {steps}…); "
            "ranges in the overlap count toward the later step"
        )
    windows_for_join = windows.rename({"step": "step_right"})
    steps = assign_steps(phases, windows_for_join)
    phases = phases.drop("step").join(steps, on="rid", how="left").sort("rid")
    crossing = (
        phases.filter(~pl.col("is_step"))
        .join(windows, on="step", how="inner")
        .filter(pl.col("end_ns") > pl.col("step_end_ns"))
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
