"""GPU metric samples per phase row and GPU: mean, p95 and sample count of each metric.

nsys samples hardware counters (``nsys profile --gpu-metrics-devices``: SM Active, Tensor
Active, DRAM bandwidth, …) every 100 µs by default, per GPU. This module puts the samples
(:mod:`analysis.normalize.gpu_metrics`: ``ts_ns`` on the run's clock, ``device``, ``metric``,
``value``) into the phase table's rows:

- a sample belongs to a row when ``start_ns <= ts_ns < end_ns`` (binary inclusion, as NVIDIA's
  ``gpu_metric_util_sum --per-projected-nvtx``); a row of several ranges (``n_ranges > 1``)
  spans its first start to its last end;
- the GPUs of a row: every sampled GPU for a *window* phase, the GPUs its operations ran on for
  a *projection* phase (:func:`projection_devices`);
- per (row, GPU, metric): ``n_samples``, ``mean``, ``p95`` (linear interpolation between
  closest ranks, numpy's default), ``min``, ``max``; a row with no sample on a GPU keeps its
  row with ``n_samples`` 0 and null statistics (NVIDIA's recipe drops such ranges).

Samples arrive in batches and are never held whole: each batch is reduced to a histogram per
(elementary time segment, GPU, metric, value) — the segments cut at every row's start and end —
and the histograms are summed. Values are counters' integers, so the histograms stay small and
the statistics are exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import polars as pl

from ..frames import PolarsDataType
from ..intervals import segment_boundaries, segment_index, segments_inside
from ..model import PROJECTION
from ..normalize.gpu_metrics import AVAILABLE_SCHEMA, SAMPLES_SCHEMA
from .phases import GROUP_KEYS

#: ``gpu_metrics_per_phase.csv``: one row per (phase row, GPU, metric).
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
    "metric": pl.String,
    "unit": pl.String,
    "n_samples": pl.Int64,
    "mean": pl.Float64,
    "p95": pl.Float64,
    "min": pl.Float64,
    "max": pl.Float64,
}
QUANTILE: Final = 0.95
#: Histogram rows kept unmerged before the parts are summed (bounds memory between batches).
_MERGE_ROWS = 2_000_000
_HIST_KEYS = ["seg", "device", "metric", "value"]
_STAT_KEYS = ["row", "device", "metric"]


def sample_histogram(samples: pl.DataFrame, edges: pl.Series) -> pl.DataFrame:
    """Samples counted per (segment, device, metric, value); samples outside every segment dropped.

    Segments as :func:`~analysis.intervals.segments_of` numbers them: ``seg`` k (1 ≤ k <
    ``len(edges)``) is ``[edges[k - 1], edges[k])``.
    """
    index = segment_index(edges, samples["ts_ns"])
    return (
        samples.with_columns(pl.Series("seg", index))
        .filter((pl.col("seg") >= 1) & (pl.col("seg") < len(edges)))
        .group_by(_HIST_KEYS)
        .agg(pl.len().cast(pl.Int64).alias("n"))
    )


def merge_histograms(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The histograms of several batches as one."""
    if not parts:
        return pl.DataFrame(schema={"seg": pl.Int64, **_without_ts(SAMPLES_SCHEMA), "n": pl.Int64})
    return pl.concat(parts).group_by(_HIST_KEYS).agg(pl.col("n").sum())


def _without_ts(schema: dict[str, PolarsDataType]) -> dict[str, PolarsDataType]:
    return {k: v for k, v in schema.items() if k != "ts_ns"}


def histogram_of(samples: pl.DataFrame | Iterable[pl.DataFrame], edges: pl.Series) -> pl.DataFrame:
    """:func:`sample_histogram` of every batch, summed as batches arrive."""
    batches = [samples] if isinstance(samples, pl.DataFrame) else samples
    parts: list[pl.DataFrame] = []
    held = 0
    for batch in batches:
        if batch.height:
            parts.append(sample_histogram(batch, edges))
            held += parts[-1].height
        if held > _MERGE_ROWS:
            parts = [merge_histograms(parts)]
            held = parts[0].height
    return merge_histograms(parts)


def projection_devices(activity: pl.LazyFrame | pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """(trace, pid, step, path, device): the GPUs each projection row's operations ran on.

    ``activity`` is ``gpu_activity`` (its ``projection_path`` is an operation's innermost
    projection range); a row's operations are those of its path and of the paths under it.
    """
    keys = ["trace", "pid", "step"]
    needed = {"trace", "pid", "projection_step", "projection_path", "device"}
    missing = sorted(needed - set(activity.lazy().collect_schema().names()))
    if missing:  # a saved analysis loads only some columns: read gpu_activity.parquet whole
        msg = f"gpu_activity lacks {', '.join(missing)}: pass the whole per-operation table"
        raise ValueError(msg)
    used = (
        activity.lazy()
        .filter(pl.col("projection_path").is_not_null())
        .select(
            "trace",
            "pid",
            pl.col("projection_step").alias("step"),
            pl.col("projection_path").alias("op_path"),
            "device",
        )
        .unique()
        .collect()
    )
    rows = phases.filter(pl.col("attribution") == PROJECTION).select(*keys, "path").unique()
    return (
        rows.join(used, on=keys, how="inner", nulls_equal=True)
        .filter(
            (pl.col("op_path") == pl.col("path"))
            | pl.col("op_path").str.starts_with(pl.col("path") + "/")
        )
        .select(*keys, "path", "device")
        .unique()
        .sort(*keys, "path", "device", nulls_last=True)
    )


def gpu_metrics_per_phase(
    phases: pl.DataFrame,
    samples: pl.DataFrame | Iterable[pl.DataFrame],
    available: pl.DataFrame,
    proj_devices: pl.DataFrame,
) -> pl.DataFrame:
    """Per (phase row, GPU, metric): ``n_samples``, ``mean``, ``p95``, ``min``, ``max``.

    ``phases``: the phase table (its keys, ``start_ns``, ``end_ns``); ``samples``: a frame or
    batches of :data:`SAMPLES_SCHEMA`; ``available``: :data:`AVAILABLE_SCHEMA`, the metrics of
    each sampled GPU; ``proj_devices``: :func:`projection_devices`. Empty (of
    :data:`TABLE_SCHEMA`) when no GPU was sampled.
    """
    if available.is_empty() or phases.is_empty():
        return pl.DataFrame(schema=TABLE_SCHEMA)
    rows = phases.select(*GROUP_KEYS, "start_ns", "end_ns").with_row_index("row")
    edges = segment_boundaries(rows["start_ns"], rows["end_ns"])
    hist = histogram_of(samples, edges)
    row_dev = _row_devices(rows, available, proj_devices)
    per_value = (
        _row_segments(rows, edges)
        .join(hist, on="seg")
        .join(row_dev, on=["row", "device"])
        .group_by(*_STAT_KEYS, "value")
        .agg(pl.col("n").sum())
    )
    grid = row_dev.join(available.select(list(AVAILABLE_SCHEMA)), on="device")
    table = (
        grid.join(_statistics(per_value), on=_STAT_KEYS, how="left")
        .with_columns(pl.col("n_samples").fill_null(0))
        .join(rows, on="row")
    )
    return (
        table.sort(
            ["step", "start_ns", "trace", "pid", "path", "attribution", "device", "metric"],
            nulls_last=True,
        )
        .select(list(TABLE_SCHEMA))
        .cast(TABLE_SCHEMA)  # type: ignore[arg-type]
    )


def _row_devices(
    rows: pl.DataFrame, available: pl.DataFrame, proj_devices: pl.DataFrame
) -> pl.DataFrame:
    """(row, device): every sampled GPU for window rows, the rows' own GPUs for projection."""
    sampled = available.select("device").unique()
    window = (
        rows.filter(pl.col("attribution") != PROJECTION).select("row").join(sampled, how="cross")
    )
    keys = ["trace", "pid", "step", "path"]
    projection = (
        rows.filter(pl.col("attribution") == PROJECTION)
        .select("row", *keys)
        .join(proj_devices.select(*keys, "device"), on=keys, nulls_equal=True)
        .join(sampled, on="device")
        .select("row", "device")
    )
    return pl.concat([window, projection]).unique()


def _row_segments(rows: pl.DataFrame, edges: pl.Series) -> pl.DataFrame:
    """(row, seg) for every elementary segment inside each row's ``[start_ns, end_ns)``."""
    return segments_inside(rows, edges, ["row"]).select("row", "seg")


def _statistics(per_value: pl.DataFrame) -> pl.DataFrame:
    """n, mean, p95 (numpy's linear interpolation), min and max from value counts."""
    ranked = (
        per_value.sort(*_STAT_KEYS, "value")
        .with_columns(
            pl.col("n").cum_sum().over(_STAT_KEYS).alias("cum"),
            pl.col("n").sum().over(_STAT_KEYS).alias("total"),
        )
        .with_columns(
            (pl.col("cum") - pl.col("n")).alias("before"),
            ((pl.col("total") - 1) * QUANTILE).alias("h"),
        )
        .with_columns(
            pl.col("h").floor().cast(pl.Int64).alias("lo"),
            pl.col("h").ceil().cast(pl.Int64).alias("hi"),
        )
    )

    def at_rank(rank: str) -> pl.Expr:
        holds = (pl.col("before") <= pl.col(rank)) & (pl.col(rank) < pl.col("cum"))
        return pl.col("value").filter(holds).first()

    stats = ranked.group_by(_STAT_KEYS).agg(
        pl.col("n").sum().alias("n_samples"),
        ((pl.col("value") * pl.col("n")).sum() / pl.col("n").sum()).alias("mean"),
        at_rank("lo").alias("v_lo"),
        at_rank("hi").alias("v_hi"),
        (pl.col("h").first() - pl.col("lo").first()).alias("t"),
        pl.col("value").min().alias("min"),
        pl.col("value").max().alias("max"),
    )
    diff = pl.col("v_hi") - pl.col("v_lo")
    p95 = (
        pl.when(pl.col("t") >= 0.5)
        .then(pl.col("v_hi") - diff * (1 - pl.col("t")))
        .otherwise(pl.col("v_lo") + diff * pl.col("t"))
    )
    return stats.with_columns(p95.alias("p95")).drop("v_lo", "v_hi", "t")
