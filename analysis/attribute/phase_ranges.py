"""A run's phase ranges as attribution takes them: hierarchy, scheme, cut marks, GPU pools."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from ..model import CUT, PROJECTION, THREAD, WINDOW
from .hierarchy import Hierarchy, build_hierarchy
from .phase_map import PhaseMap
from .pool_outputs import PoolInputs
from .pools import Pools, resolve_pools


def phases_and_pools(
    ranges: pl.DataFrame,
    launch_threads: pl.DataFrame,
    devices: list[str],
    phase_map: PhaseMap,
    capture_ends: Mapping[str, int],
    pool_inputs: PoolInputs | None,
) -> tuple[Hierarchy, pl.DataFrame, Pools]:
    """The phase hierarchy, the phase ranges (attribution, cut marks) and the run's pools.

    With pools, the hierarchy is built again so that processes without step ranges take their
    steps from their own pool's (the rollouter's versions), not the trainer's.
    """
    hierarchy = build_hierarchy(ranges, phase_map)
    phases = mark_cut(_with_attribution(hierarchy.phases, launch_threads), capture_ends)
    if pool_inputs is None:
        return hierarchy, phases, Pools.whole(devices)
    pools = resolve_pools(
        phases,
        marks=pool_inputs.marks,
        process_devices=pool_inputs.process_devices,
        process_names=pool_inputs.process_names,
        devices=devices,
        given=pool_inputs.given,
    )
    if pools.split:
        hierarchy = build_hierarchy(ranges, phase_map, groups=pools.members)
        phases = mark_cut(_with_attribution(hierarchy.phases, launch_threads), capture_ends)
    return hierarchy, phases, pools


def mark_cut(ranges: pl.DataFrame, capture_ends: Mapping[str, int]) -> pl.DataFrame:
    """``ranges`` (``trace, start_ns, end_ns``) with :data:`~analysis.model.CUT`.

    A range is cut when it ends exactly at its file's capture end (``capture_ends``: label →
    ``ANALYSIS_DETAILS.duration`` on the run's clock) and starts before it: the rule of
    analyze's warning (:mod:`analysis.normalize.events`). nsys closes a range still open when
    the capture stops there (its process exited before its last NVTX events were flushed), so
    its duration runs to the capture's end, not to its own. A file of unknown end: not cut.
    """
    end = pl.col("trace").replace_strict(dict(capture_ends), default=None, return_dtype=pl.Int64)
    cut = (pl.col("end_ns") == end) & (pl.col("start_ns") < end)
    return ranges.with_columns(cut.fill_null(False).alias(CUT))


def _with_attribution(phases: pl.DataFrame, launch_threads: pl.DataFrame) -> pl.DataFrame:
    """Ranges on a thread that launched GPU work are *projection*, the others *window*."""
    on_launch_thread = phases.join(
        launch_threads.with_columns(pl.lit(True).alias("launches")),
        on=list(THREAD),
        how="left",
    )["launches"].fill_null(False)
    return phases.with_columns(
        pl.when(on_launch_thread)
        .then(pl.lit(PROJECTION))
        .otherwise(pl.lit(WINDOW))
        .alias("attribution")
    )
