"""Energy conservation: three independent figures over a run's window timeline must agree.

The counters' total over the sampled span, the sum of every phase's energy outside its children
(:func:`exclusive_intervals`), and the energy of the time no phase covers are each measured from
the cumulative-energy curves, never one as the others' remainder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ..frames import int_value
from ..intervals import reach
from .samples import PowerData, cumulative_energy, energy_at, sample_faults

#: Relative tolerance of the conservation check. Every part is a difference of one cumulative
#: curve per device, linearly interpolated at the phases' ends; interpolation moves energy
#: between neighbouring parts but never loses or adds any (the parts telescope), so in exact
#: arithmetic they sum to the total. What remains is float rounding, a few ulps of the counter
#: value per interpolated end: below 1e-9 of the total even at a million phase ends. 1e-6
#: leaves a margin of 1000 and is still far below a single phase counted twice.
BALANCE_RTOL = 1e-6
#: Absolute floor of the tolerance (J), for runs that drew (almost) nothing.
BALANCE_ATOL_J = 1e-9


def exclusive_intervals(ranges: pl.DataFrame) -> pl.DataFrame:
    """Each range's time outside its child ranges: ``rid, start_ns, end_ns`` (several per rid).

    ``ranges``: ``rid, parent_rid, start_ns, end_ns``; a child counts only where it lies inside
    its parent, and only children among ``ranges`` count. A range without children is one
    piece, its whole interval; a range its children cover entirely has none.
    """
    parents = ranges.select("rid", pl.col("start_ns").alias("p0"), pl.col("end_ns").alias("p1"))
    children = (
        ranges.filter(pl.col("parent_rid").is_not_null())
        .select(pl.col("parent_rid").alias("rid"), "start_ns", "end_ns")
        .join(parents, on="rid")
        .with_columns(
            pl.max_horizontal("start_ns", "p0").alias("start_ns"),
            pl.min_horizontal("end_ns", "p1").alias("end_ns"),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("rid", "start_ns", "end_ns")
        .with_columns(reach("rid").alias("reach"))
    )
    before_each = children.select(
        "rid", pl.coalesce("reach", "p0").alias("start_ns"), pl.col("start_ns").alias("end_ns")
    )
    after_last = children.group_by("rid").agg(
        pl.col("end_ns").max().alias("start_ns"), pl.col("p1").first().alias("end_ns")
    )
    childless = ranges.join(children.select("rid").unique(), on="rid", how="anti").select(
        "rid", "start_ns", "end_ns"
    )
    schema = {"rid": ranges.schema["rid"], "start_ns": pl.Int64, "end_ns": pl.Int64}
    return (
        pl.concat([f.cast(schema) for f in (before_each, after_last, childless)])  # type: ignore[arg-type]
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("rid", "start_ns")
    )


def piece_energy(cum: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """``energy_j`` of each (``device``, ``start_ns``, ``end_ns``) row, from the counter curve."""
    if pieces.is_empty():
        return pieces.with_columns(pl.lit(None, dtype=pl.Float64).alias("energy_j"))
    at_start = energy_at(cum, pieces.select("device", pl.col("start_ns").alias("t_ns")))
    at_end = energy_at(cum, pieces.select("device", pl.col("end_ns").alias("t_ns")))
    return pieces.with_columns((at_end["cum_j"] - at_start["cum_j"]).alias("energy_j"))


def energy_balance(
    power: PowerData,
    timeline: pl.DataFrame,
    *,
    pools: Sequence[tuple[pl.DataFrame, Sequence[str] | None]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Total, attributed and unattributed energy, measured independently, and their check.

    ``timeline``: the window timeline's ranges (``rid, parent_rid, start_ns, end_ns``: the
    driver's window ranges, or every phase when there are none), on every sampled GPU:

    - ``total_energy_j``: the counters over the whole sampled span (last − first reading);
    - ``attributed_energy_j``: Σ over the timeline's ranges of their energy outside their
      children (a window phase's ``gap_energy_j``, or ``energy_j`` when it has no children);
    - ``unattributed_energy_j``: the energy of the stretches no range covers;
    - ``energy_conserved``: total = attributed + unattributed within :data:`BALANCE_RTOL`
      (``energy_balance_j`` = attributed + unattributed − total). Ranges that overlap without
      nesting (several driver threads or files, e.g. two runs forced together) count the
      shared time twice; that is what the check catches, with a warning.

    All null (None) when a device's samples are broken (:func:`sample_faults`;
    :func:`phase_energy` says which). ``pools`` (a run with GPU pools): each pool's timeline and
    GPUs; a pool's ranges then count on its own GPUs only, and a sampled GPU of no pool is
    wholly unattributed.
    """
    cum = cumulative_energy(power)
    if sample_faults(cum) or cum.is_empty():
        return dict.fromkeys(_BALANCE_KEYS), []
    devices = pl.DataFrame({"device": sorted(cum["device"].unique().to_list())})
    total = float(
        cum.group_by("device")
        .agg(pl.col("cum_j").last() - pl.col("cum_j").first())
        .sort("device")["cum_j"]
        .sum()
    )
    span = (int_value(cum["t_ns"].min()), int_value(cum["t_ns"].max()))
    groups = [(timeline, None)] if pools is None else list(pools)
    owns, uncovereds = [], []
    pooled: set[str] = set()
    for ranges_of, gpus in groups:
        ranges = ranges_of.select("rid", "parent_rid", "start_ns", "end_ns")
        mine = devices if gpus is None else devices.filter(pl.col("device").is_in(list(gpus)))
        pooled.update(mine["device"].to_list())
        owns.append(exclusive_intervals(ranges).join(mine, how="cross"))
        uncovereds.append(_uncovered(ranges, *span).join(mine, how="cross"))
    # sampled GPUs of no pool: all their energy lies outside every phase
    rest = devices.filter(~pl.col("device").is_in(sorted(pooled))) if pools is not None else None
    if rest is not None and rest.height:
        uncovereds.append(
            pl.DataFrame({"start_ns": [span[0]], "end_ns": [span[1]]}).join(rest, how="cross")
        )
    attributed = _sorted_sum(piece_energy(cum, pl.concat(owns, how="diagonal_relaxed")))
    unattributed = _sorted_sum(piece_energy(cum, pl.concat(uncovereds, how="diagonal_relaxed")))
    balance = attributed + unattributed - total
    tolerance = BALANCE_RTOL * max(abs(total), abs(attributed + unattributed)) + BALANCE_ATOL_J
    conserved = abs(balance) <= tolerance
    warnings = []
    if not conserved:
        why = (
            "phase ranges overlap without nesting (driver ranges of several threads or files, "
            "e.g. files of different runs), so their shared time is counted twice"
            if balance > 0
            else "please report this trace"
        )
        warnings.append(
            f"energy not conserved: {attributed:.3f} J in phases + {unattributed:.3f} J outside "
            f"them = {attributed + unattributed:.3f} J, but the counters measured {total:.3f} J "
            f"({balance:+.3f} J): {why}"
        )
    summary = {
        "total_energy_j": total,
        "attributed_energy_j": attributed,
        "unattributed_energy_j": unattributed,
        "energy_conserved": conserved,
        "energy_balance_j": balance,
    }
    return summary, warnings


_BALANCE_KEYS = (
    "total_energy_j",
    "attributed_energy_j",
    "unattributed_energy_j",
    "energy_conserved",
    "energy_balance_j",
)


def _sorted_sum(frame: pl.DataFrame) -> float:
    """Σ ``energy_j`` in a fixed order (bit-identical from run to run)."""
    if frame.is_empty():
        return 0.0
    return float(frame.sort("device", "start_ns", "end_ns")["energy_j"].sum())


def _uncovered(ranges: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """Stretches of ``[lo, hi]`` that no range covers: ``start_ns, end_ns``."""
    ordered = ranges.select("start_ns", "end_ns").sort("start_ns", "end_ns")
    gaps = ordered.with_columns(reach().fill_null(lo).alias("reach")).select(
        pl.col("reach").alias("start_ns"), pl.col("start_ns").alias("end_ns")
    )
    furthest = int_value(ordered["end_ns"].max()) if ordered.height else lo
    tail = pl.DataFrame({"start_ns": [furthest], "end_ns": [hi]})
    return (
        pl.concat([gaps.cast(pl.Int64), tail.cast(pl.Int64)])
        .with_columns(
            pl.col("start_ns").clip(lo, hi),
            pl.col("end_ns").clip(lo, hi),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
