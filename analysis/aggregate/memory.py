"""Device memory in use per phase row and GPU: level on entry, peak, time-weighted mean.

Definitions (also in the README):

- memory in use on a GPU at time t, ``level(t)``: per source (one file's process on one GPU),
  the caching allocator's ``Total Allocated`` after its last event at or before t where the
  trace gives it (Kineto: ``basis`` ``allocator_total``, absolute), else Σ allocated − Σ freed
  bytes since the capture started (nsys: ``since_capture_start``; memory allocated before the
  capture is not in it, so the level can be negative); summed over the GPU's sources. Before a
  source's first event its level is ``Total Allocated − Bytes`` of that event (Kineto) or 0.
- a phase row covers ``[start_ns, end_ns)``; ``entry_bytes`` = the level just before
  ``start_ns`` (after every event with ``ts < start_ns``); ``peak_bytes`` = the max of the entry
  level and the level after each event with ``start_ns <= ts < end_ns``, taken event by event
  (an allocation freed at the same ns still counts); ``mean_bytes`` = ∫ level dt / wall
  (level right-continuous; null for a zero-length row).
- offload/onload: ``d2h_bytes`` / ``h2d_bytes`` = bytes of the device→host / host→device copies
  on that GPU that start inside ``[start_ns, end_ns)`` (the window definition of the phase
  table's ``memcpy_bytes``, applied per GPU and direction, for both schemes; a copy is not split);
  null when the per-operation table is not at hand.
- the GPUs of a row: every GPU with memory events for a *window* row, those its operations ran
  on (and that have memory events) for a *projection* row.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..frames import PolarsDataType
from ..model import PROJECTION

#: ``memory_per_phase.csv``: one row per (phase row, GPU).
TABLE_SCHEMA: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "pid": pl.Int64,
    "step": pl.Int64,
    "phase": pl.String,
    "path": pl.String,
    "attribution": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "device": pl.String,
    "basis": pl.String,
    "n_events": pl.Int64,
    "entry_bytes": pl.Int64,
    "peak_bytes": pl.Int64,
    "mean_bytes": pl.Float64,
    "h2d_bytes": pl.Int64,
    "d2h_bytes": pl.Int64,
}
#: memcpy classes counted as onload (host → device) and offload (device → host)
COPY_CLASSES = {"h2d_bytes": "memcpy_h2d", "d2h_bytes": "memcpy_d2h"}
_KEYS = ["trace", "pid", "step", "phase", "path", "attribution", "start_ns", "end_ns"]


def memory_levels(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(levels, devices): the level after each event per GPU, and each GPU's start and basis.

    ``levels``: ``device, ts_ns, level`` in event order; ``devices``: ``device, initial``
    (the level before its first event), ``basis``.
    """
    order = ["device", "source", "ts_ns", "seq"]
    per_source = (
        events.sort(order)
        .with_columns(pl.col("total").is_not_null().all().over("device", "source").alias("_abs"))
        .with_columns(
            pl.when(pl.col("_abs"))
            .then(pl.col("total"))
            .otherwise(pl.col("delta").cum_sum().over("device", "source"))
            .alias("_lvl")
        )
        .with_columns(
            pl.when(pl.col("_abs"))
            .then(pl.col("total").first() - pl.col("delta").first())
            .otherwise(0)
            .over("device", "source")
            .alias("_init")
        )
        .with_columns(
            (pl.col("_lvl") - pl.col("_lvl").shift(1).over("device", "source"))
            .fill_null(pl.col("_lvl") - pl.col("_init"))
            .alias("_step")
        )
    )
    devices = (
        per_source.group_by("device", "source")
        .agg(pl.col("_init").first(), pl.col("_abs").first())
        .group_by("device")
        .agg(
            pl.col("_init").sum().alias("initial"),
            pl.when(pl.col("_abs").all())
            .then(pl.lit("allocator_total"))
            .when(~pl.col("_abs").any())
            .then(pl.lit("since_capture_start"))
            .otherwise(pl.lit("mixed"))
            .alias("basis"),
        )
        .sort("device")
    )
    levels = (
        per_source.sort("device", "ts_ns", "source", "seq")
        .join(devices.select("device", "initial"), on="device")
        .select(
            "device",
            "ts_ns",
            (pl.col("initial") + pl.col("_step").cum_sum().over("device")).alias("level"),
        )
    )
    return levels, devices


def _device_stats(
    levels: pl.DataFrame, initial: int, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per interval: events inside, entry level, peak, mean (NaN where zero length)."""
    ts = levels["ts_ns"].to_numpy()
    lvl = levels["level"].to_numpy().astype(np.int64)
    lo = np.searchsorted(ts, starts, side="left")
    hi = np.searchsorted(ts, ends, side="left")
    entry = np.where(lo > 0, lvl[np.maximum(lo - 1, 0)], initial)
    padded = np.append(lvl, 0)
    pairs = np.stack([lo, hi], axis=1).ravel()
    inside = np.maximum.reduceat(padded, pairs)[::2] if len(pairs) else np.zeros(0, np.int64)
    peak = np.where(hi > lo, np.maximum(entry, inside), entry)
    # ∫ level: cumulative area at each event (float: bytes × ns exceeds int64)
    widths = np.diff(ts).astype(np.float64)
    area = np.concatenate([[0.0], np.cumsum(lvl[:-1].astype(np.float64) * widths)])

    def integral(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ts, t, side="right") - 1
        before = float(initial) * (t - ts[0]).astype(np.float64)
        kk = np.maximum(k, 0)
        after = area[kk] + lvl[kk].astype(np.float64) * (t - ts[kk]).astype(np.float64)
        return np.where(k >= 0, after, before)

    wall = (ends - starts).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(wall > 0, (integral(ends) - integral(starts)) / wall, np.nan)
    return hi - lo, entry, peak, mean


def copies_of(activity: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame | None:
    """``device, op_class, start_ns, bytes`` of the H2D and D2H copies; None without the columns."""
    names = activity.lazy().collect_schema().names()
    if not {"kind", "op_class", "device", "start_ns", "bytes"} <= set(names):
        return None
    return (
        activity.lazy()
        .filter(pl.col("kind") == "memcpy")
        .select("device", pl.col("op_class").cast(pl.String), "start_ns", "bytes")
        .filter(pl.col("op_class").is_in(list(COPY_CLASSES.values())))
        .collect()
    )


def _copy_sums(copies: pl.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes of ``copies`` (one GPU, one direction) starting in each ``[start, end)``."""
    ordered = copies.sort("start_ns")
    ts = ordered["start_ns"].to_numpy()
    cum = np.concatenate([[0], np.cumsum(ordered["bytes"].fill_null(0).to_numpy())])
    return cum[np.searchsorted(ts, ends, side="left")] - cum[np.searchsorted(ts, starts, "left")]


def memory_per_phase(
    phases: pl.DataFrame,
    events: pl.DataFrame,
    projection_devices: pl.DataFrame,
    copies: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per (phase row, GPU with memory events): :data:`TABLE_SCHEMA` (see module doc).

    ``events``: :data:`analysis.normalize.memory.EVENTS_SCHEMA`; ``projection_devices``:
    (trace, pid, step, path, device) of projection rows
    (:func:`analysis.aggregate.gpu_metrics.projection_devices`); ``copies``: :func:`copies_of`
    the run's operations (None: copy bytes null).
    """
    if events.is_empty() or phases.is_empty():
        return pl.DataFrame(schema=TABLE_SCHEMA)
    levels, devices = memory_levels(events)
    rows = phases.select(_KEYS)
    window = rows.filter(pl.col("attribution") != PROJECTION).join(
        devices.select("device"), how="cross"
    )
    projection = rows.filter(pl.col("attribution") == PROJECTION).join(
        projection_devices.select("trace", "pid", "step", "path", "device").unique(),
        on=["trace", "pid", "step", "path"],
        nulls_equal=True,
    )
    pairs = pl.concat([window, projection.select(window.columns)]).join(
        devices.select("device"), on="device", how="semi"
    )
    parts = []
    for device, initial, basis in devices.iter_rows():  # one pass per GPU, vectorized inside
        chosen = pairs.filter(pl.col("device") == device)
        if chosen.is_empty():
            continue
        n, entry, peak, mean = _device_stats(
            levels.filter(pl.col("device") == device),
            int(initial),
            chosen["start_ns"].to_numpy(),
            chosen["end_ns"].to_numpy(),
        )
        starts, ends = chosen["start_ns"].to_numpy(), chosen["end_ns"].to_numpy()
        moved = {
            column: pl.Series(
                column,
                None
                if copies is None
                else _copy_sums(
                    copies.filter((pl.col("device") == device) & (pl.col("op_class") == cls)),
                    starts,
                    ends,
                ),
                dtype=pl.Int64,
            )
            for column, cls in COPY_CLASSES.items()
        }
        parts.append(
            chosen.with_columns(
                *moved.values(),
                pl.lit(basis).alias("basis"),
                pl.Series("n_events", n, dtype=pl.Int64),
                pl.Series("entry_bytes", entry, dtype=pl.Int64),
                pl.Series("peak_bytes", peak, dtype=pl.Int64),
                pl.Series("mean_bytes", mean, dtype=pl.Float64).fill_nan(None),
            )
        )
    if not parts:
        return pl.DataFrame(schema=TABLE_SCHEMA)
    table = pl.concat(parts).select(list(TABLE_SCHEMA)).cast(TABLE_SCHEMA)  # type: ignore[arg-type]
    return table.sort("attribution", "trace", "pid", "step", "start_ns", "path", "device")
