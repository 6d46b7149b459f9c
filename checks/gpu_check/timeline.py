"""The run on one clock: recorder ranges, one GPU's samples, phase windows, sampling cadence."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import polars as pl

from checks.gpu_check.environment import normalize_gpu_uuid
from checks.gpu_check.model import PHASES

RANGE_SCHEMA = {
    "name": pl.String,
    "path": pl.String,
    "step": pl.Int64,
    "pid": pl.Int64,
    "start_mono_ns": pl.Int64,
    "end_mono_ns": pl.Int64,
    "start_wall_ns": pl.Int64,
    "dur_ns": pl.Int64,
}


def read_ranges(path: Path) -> pl.DataFrame:
    """The JSONL recorder's ranges (``nvtx_phases.marking``), one row per closed range."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pl.DataFrame([{k: r.get(k) for k in RANGE_SCHEMA} for r in rows], schema=RANGE_SCHEMA)


def map_to_sampler_clock(
    ranges: pl.DataFrame, samples: pl.DataFrame
) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Ranges with ``start_ns``/``end_ns`` on the sampler's ``mono_ns`` clock, and how.

    The recorder stamps ranges with ``time.monotonic_ns()`` (``start_mono_ns``/``end_mono_ns``,
    plus ``start_wall_ns`` from ``time.time_ns()``); the sampler stamps samples with the same two
    calls (``mono_ns``, ``wall_ns``). Ranges of a process that also sampled are on the sampler's
    clock as they are. Otherwise (another process, possibly another host) the range's wall start
    is mapped through the sampler's own wall−mono offset (accuracy = the hosts' clock sync).
    """
    sampler_offset = (samples["wall_ns"] - samples["mono_ns"]).median()
    range_offset = (ranges["start_wall_ns"] - ranges["start_mono_ns"]).median()
    same = set(ranges["pid"].unique().to_list()) <= set(samples["pid"].unique().to_list())
    if same:
        method = (
            "same host clock: ranges and samples come from one process, both stamped with "
            "time.monotonic_ns() (CLOCK_MONOTONIC); no conversion"
        )
        mapped = ranges.with_columns(
            pl.col("start_mono_ns").alias("start_ns"), pl.col("end_mono_ns").alias("end_ns")
        )
    else:
        method = "different processes: start_wall_ns − median(sampler wall_ns − mono_ns)"
        start = pl.col("start_wall_ns") - int(sampler_offset)
        mapped = ranges.with_columns(
            start.alias("start_ns"), (start + pl.col("dur_ns")).alias("end_ns")
        )
    info = {
        "jsonl_clock": "start_mono_ns/end_mono_ns = time.monotonic_ns(); start_wall_ns = time.time_ns()",
        "sampler_clock": "mono_ns = time.monotonic_ns(); wall_ns = time.time_ns()",
        "same_clock": same,
        "method": method,
        "wall_minus_mono_disagreement_us": round((range_offset - sampler_offset) / 1000.0, 3),
    }
    return mapped, info


def select_device(samples: pl.DataFrame, device_uuid: str | None) -> tuple[pl.DataFrame, str]:
    """One GPU's samples, as ``device, t_ns, power_w, energy_mj`` (+ host, pid, wall_ns, mono_ns).

    The GPU is the one whose UUID is ``device_uuid`` (torch's), else the first sample's GPU.
    """
    spelled = {u: normalize_gpu_uuid(u) for u in samples["uuid"].drop_nulls().unique().to_list()}
    with_name = samples.with_columns(
        pl.coalesce(
            pl.col("uuid").replace_strict(spelled, default=None, return_dtype=pl.String),
            pl.lit("nvml:") + pl.col("device").cast(pl.String),
        ).alias("device")
    )
    names = with_name["device"].unique().to_list()
    chosen = (
        device_uuid if device_uuid is not None and device_uuid in names else with_name["device"][0]
    )
    mine = with_name.filter(pl.col("device") == chosen).sort("mono_ns")
    return mine.with_columns(pl.col("mono_ns").alias("t_ns")), chosen


def phase_windows(ranges: pl.DataFrame, device: str) -> pl.DataFrame:
    """One row per (step, phase) range: ``id, device, step, phase, start_ns, end_ns``."""
    paths = [f"step/{p}" for p in PHASES]
    return (
        ranges.filter(pl.col("path").is_in(paths))
        .sort("start_ns")
        .select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("id"),
            pl.lit(device).alias("device"),
            "step",
            pl.col("name").alias("phase"),
            "start_ns",
            "end_ns",
        )
    )


def interval_stats(t_ns: list[int], requested_s: float) -> dict[str, Any]:
    """Achieved sampling interval: median and p95 (nearest rank) in ms vs requested."""
    gaps = sorted((b - a) / 1e6 for a, b in itertools.pairwise(t_ns))
    if not gaps:
        return {"requested_ms": requested_s * 1e3, "samples": len(t_ns)}
    p95 = gaps[min(len(gaps) - 1, math.ceil(0.95 * len(gaps)) - 1)]
    return {
        "requested_ms": requested_s * 1e3,
        "samples": len(t_ns),
        "median_ms": round(statistics.median(gaps), 3),
        "p95_ms": round(p95, 3),
    }


def update_period_ms(t_ns: list[int], values: list[Any]) -> dict[str, Any]:
    """How often a reading actually changes: median ms between changes, share of repeats.

    A counter or power value that NVML refreshes less often than it is sampled repeats; its
    refresh period bounds how sharply it can place an edge.
    """
    changes = [t for t, a, b in zip(t_ns[1:], values, values[1:], strict=False) if a != b]
    repeats = sum(a == b for a, b in itertools.pairwise(values))
    return {
        "median_change_ms": (
            round(statistics.median((b - a) / 1e6 for a, b in itertools.pairwise(changes)), 3)
            if len(changes) > 1
            else None
        ),
        "repeat_fraction": round(repeats / (len(values) - 1), 3) if len(values) > 1 else None,
    }
