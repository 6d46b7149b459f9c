"""A run on one timeline: Chrome trace-event JSON for ui.perfetto.dev and chrome://tracing.

Processes, in order: each traced process (``<trace> pid <pid>``, drivers first) with one slice
per NVTX range on its thread's track (:mod:`analysis.render.timeline.ranges`); each physical
GPU (``GPU <device> (<name>)``): a track per stream (and launching process, where several share
it), counters ``power`` (W, every sample) and ``GPU busy`` (fraction of each time bin its
operations' union covers). Steps are global instants. Times: µs on the run's clock (ns / 1000,
exact to the ns). Past ``max_ranges`` ranges the shortest are left out; past ``max_ops``
operations, each stream's are merged into busy blocks (operations less than the smallest 1-2-5
µs gap that fits apart), every busy ns kept. ``otherData`` and the notes say what was thinned.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from ...intervals import opens_block, overlaps_earlier, past_reach, reach
from ...model import WINDOW, Analysis
from ..outputs.atomic import atomic_write
from .ranges import nest_lanes, timeline_ranges

SPAN_COLUMNS: Final = ("trace", "pid", "device", "stream", "start_ns", "end_ns")
#: what one operation's slice shows (columns an analysis lacks are left out)
OP_COLUMNS: Final = (
    *(*SPAN_COLUMNS, "op_id", "kind", "op_class", "name", "bytes", "correlation_id"),
    *("projection_path", "window_path"),
)
OP_ARGS: Final = (
    *("kind", "op_id", "pid", "correlation_id", "bytes", "projection_path", "window_path"),
)
NO_OPS: Final = {
    c: pl.Int64 if c.endswith(("id", "ns", "bytes", "stream")) else pl.String for c in OP_COLUMNS
}
STREAM: Final = ("device", "trace", "pid", "stream")
#: merge gaps tried, smallest first (ns): 0 (overlapping operations only), then 1-2-5 µs steps
GAPS_NS: Final = (0, *(m * 10**e for e in range(3, 13) for m in (1, 2, 5)))
#: bins of the busy-fraction counter over the run's operations (each at least 1 µs)
BUSY_BINS: Final = 2000

Event = dict[str, Any]


def us(ns: float) -> float:
    """Nanoseconds → µs, the format's unit (a double holds any run's clock to the ns)."""
    return ns / 1000


def _present(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` without null values, at every level (a group left empty is dropped)."""
    out = {}
    for key, value in args.items():
        value = _present(value) if isinstance(value, dict) else value
        if value is not None and value != {}:
            out[key] = value
    return out


@dataclass(frozen=True)
class Timeline:
    """The trace's events, kept as frames until written (:meth:`events`).

    ``slices``: frames of ``pid_v, tid, name, cat, start_ns, end_ns, args`` (a struct), each
    sorted by track, start and longest first; ``counters``: ``pid_v, name, key, t_ns, value``;
    ``notes``: what the user should know (ranges left out, operations merged, or not
    available), also in ``other_data``.
    """

    metadata: list[Event]
    slices: list[pl.DataFrame]
    counters: pl.DataFrame
    instants: list[Event]
    other_data: dict[str, Any]
    notes: list[str]

    @property
    def n_events(self) -> int:
        """How many events :meth:`events` yields."""
        n_slices = sum(frame.height for frame in self.slices)
        return len(self.metadata) + n_slices + self.counters.height + len(self.instants)

    def events(self) -> Iterator[Event]:
        """Every trace event: metadata, range and GPU slices, counters, step instants."""
        yield from self.metadata
        for frame in self.slices:
            for pid, tid, name, cat, start, end, args in frame.iter_rows():
                event = dict(ph="X", pid=pid, tid=tid, name=name, cat=cat, ts=us(start))
                yield event | {"dur": us(end - start), "args": _present(args)}
        for pid, name, key, t_ns, value in self.counters.iter_rows():
            yield {"ph": "C", "pid": pid, "name": name, "ts": us(t_ns), "args": {key: value}}
        yield from self.instants


def _with_gaps(spans: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Sorted by ``keys`` and start; ``gap``: ns since the furthest end before, in its group."""
    return (
        spans.sort([*keys, "start_ns", "end_ns"])
        .with_columns(reach(keys).alias("prev_end"))
        .with_columns((pl.col("start_ns") - pl.col("prev_end")).alias("gap"))
    )


def merge_blocks(spans: pl.DataFrame, gap_ns: int, keys: Sequence[str] = STREAM) -> pl.DataFrame:
    """Per group, operations less than ``gap_ns`` apart (0: overlapping ones) as one block.

    Columns ``keys, start_ns, end_ns, n_ops, busy_ns`` (the union of its operations, the
    block's length when ``gap_ns`` is 0).
    """
    new_block = opens_block(pl.col("prev_end"), gap_ns)
    return (
        _with_gaps(spans, keys)
        .with_columns(
            new_block.cum_sum().alias("block"), past_reach(pl.col("prev_end")).alias("busy_ns")
        )
        .group_by("block", maintain_order=True)
        .agg(
            *(pl.col(k).first() for k in keys),
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.len().cast(pl.Int64).alias("n_ops"),
            pl.col("busy_ns").sum(),
        )
        .drop("block")
    )


def choose_gap(spans: pl.DataFrame, max_ops: int) -> int:
    """The smallest of :data:`GAPS_NS` that merges ``spans`` into at most ``max_ops`` blocks."""
    gapped = _with_gaps(spans, STREAM)
    n_streams = gapped.select(pl.struct(STREAM).n_unique()).item()
    gaps = np.sort(gapped["gap"].drop_nulls().to_numpy())
    for gap in GAPS_NS:
        if n_streams + len(gaps) - int(np.searchsorted(gaps, gap)) <= max_ops:
            return gap
    return GAPS_NS[-1]


def busy_fraction(spans: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Per device and time bin, the share of the bin its operations (their union) cover.

    Returns (``device, t_ns, value``: one row per bin start and a 0 at the last bin's end; the
    bin width in ns). The bins span the run's operations, the same edges on every device.
    """
    union = merge_blocks(spans, 0, ("device",))
    if union.is_empty():
        return pl.DataFrame(schema={"device": pl.String, "t_ns": pl.Int64, "value": pl.Float64}), 0
    lo, hi = int(union["start_ns"].min()), int(union["end_ns"].max())  # type: ignore[arg-type]
    width = next(
        m * 10**e for e in range(3, 19) for m in (1, 2, 5) if m * 10**e * BUSY_BINS >= hi - lo
    )
    edges = np.arange(lo // width * width, hi + width, width, dtype=np.int64)
    parts = []
    for (device,), part in union.partition_by("device", as_dict=True, maintain_order=True).items():
        s, e = part["start_ns"].to_numpy(), part["end_ns"].to_numpy()
        cum = np.concatenate([[0], np.cumsum(e - s)])
        k = np.searchsorted(s, edges, side="right")  # intervals starting at or before each edge
        last = np.maximum(k - 1, 0)
        busy = np.where(k > 0, cum[last] + np.clip(edges - s[last], 0, e[last] - s[last]), 0)
        values = np.append(np.diff(busy) / width, 0.0)
        parts.append(pl.DataFrame({"device": device, "t_ns": edges, "value": values}))
    return pl.concat(parts), width


def _meta(kind: str, pid: int, value: str | int, tid: int | None = None) -> Event:
    key = "name" if kind.endswith("_name") else "sort_index"
    return {"ph": "M", "name": kind, "pid": pid, "args": {key: value}} | (
        {"tid": tid} if tid else {}
    )


def _processes(
    analysis: Analysis, spans: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, list[Event]]:
    """The viewer's processes: (ranks ``trace, pid, pid_v``; GPUs ``device, pid_v``; metadata).

    Ranks: every process with NVTX ranges, drivers (window ranges) first. GPUs: the summary's
    physical GPUs, then any other device the operations or power samples name.
    """
    power = analysis.power_samples
    ranges = (
        analysis.ranges
        if analysis.ranges is not None
        else pl.DataFrame(schema={"trace": pl.String, "pid": pl.Int64, "attribution": pl.String})
    )
    window = ranges.filter(pl.col("attribution") == WINDOW)
    drivers = set(window.select("trace", "pid").iter_rows())
    every = set(ranges.select("trace", "pid").unique().iter_rows())
    ranks = sorted(every, key=lambda process: (process not in drivers, process))
    gpus = {d.device: f" ({d.gpu_name})" if d.gpu_name else "" for d in analysis.summary.devices}
    seen = set(spans["device"]) | (set(power["device"]) if power is not None else set())
    gpus |= {device: "" for device in sorted(seen - set(gpus) - {None})}
    labels = [f"{t} pid {p}" for t, p in ranks] + [f"GPU {d}{name}" for d, name in gpus.items()]
    meta = [
        event
        for pid, label in enumerate(labels, 1)
        for event in (_meta("process_name", pid, label), _meta("process_sort_index", pid, pid))
    ]
    n = len(ranks)
    rank_ids = pl.DataFrame(
        [(t, p, i) for i, (t, p) in enumerate(ranks, 1)],
        schema={"trace": pl.String, "pid": pl.Int64, "pid_v": pl.Int64},
        orient="row",
    )
    gpu_ids = pl.DataFrame(
        {"device": list(gpus), "pid_v": range(n + 1, n + len(gpus) + 1)},
        schema={"device": pl.String, "pid_v": pl.Int64},
    )
    return rank_ids, gpu_ids, meta


def _assign_tracks(rows: pl.DataFrame, keys: list[str]) -> tuple[pl.DataFrame, list[Event]]:
    """Rows → a track (``tid``) per group of ``keys`` and lane (:func:`nest_lanes`), named.

    ``rows`` hold ``pid_v`` (the first key), ``label`` (the track's name; extra lanes add
    `` #2``, …) and ``order`` (among equal intervals, lower first). Returns the slice frame
    (:class:`Timeline`), sorted by track, start and longest first, and the tracks' metadata.
    """
    by = [*keys, "start_ns", "end_ns", "order"]
    rows = rows.sort(by, descending=[*(False for _ in keys), False, True, False])
    overlap = overlaps_earlier(keys)
    lanes = [0] * rows.height
    if rows.height and rows.select(overlap.any()).item():
        lanes = []
        for part in rows.partition_by(keys, maintain_order=True):
            lanes += nest_lanes(part["start_ns"].to_list(), part["end_ns"].to_list())
    rows = rows.with_columns(pl.Series("lane", lanes, dtype=pl.Int64))
    tracks = (
        rows.group_by(*keys, "lane", maintain_order=True)
        .agg(pl.col("label").first())
        .sort(*keys, "lane")
        .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("pid_v").alias("tid"))
    )
    meta: list[Event] = []
    for pid, tid, lane, label in tracks.select("pid_v", "tid", "lane", "label").iter_rows():
        name = f"{label} #{lane + 1}" if lane else label
        meta += [_meta("thread_name", pid, name, tid), _meta("thread_sort_index", pid, tid, tid)]
    on = [*keys, "lane"]
    rows = rows.join(tracks.select(*on, "tid"), on=on, how="left", maintain_order="left")
    return rows.select("pid_v", "tid", "name", "cat", "start_ns", "end_ns", "args"), meta


def _op_slices(ops: pl.DataFrame, gpus: pl.DataFrame) -> tuple[pl.DataFrame, list[Event]]:
    """Operations (or merged blocks) on their GPU's tracks: one per stream and launching process."""
    shared = ops.group_by("device").agg(pl.struct("trace", "pid").n_unique().alias("n_procs"))
    stream = pl.format("stream {}", "stream")
    merged = "n_ops" in ops.columns
    what = {
        "name": pl.lit("merged operations") if merged else pl.coalesce("name", "kind"),
        "cat": pl.lit("merged") if merged else pl.coalesce("op_class", "kind"),
        "args": pl.struct("n_ops", "busy_ns") if merged else pl.struct(OP_ARGS),
        "label": pl.when(pl.col("n_procs") > 1).then(pl.format("{} · pid {}", stream, "pid")),
    }
    rows = ops.join(gpus, on="device").join(shared, on="device").with_columns(**what)
    rows = rows.with_columns(pl.col("label").fill_null(stream), order=pl.lit(0))
    return _assign_tracks(rows, ["pid_v", "trace", "pid", "stream"])


def _collect_ops(
    activity: pl.LazyFrame, max_ops: int, merge_gap_ns: int | None
) -> tuple[pl.DataFrame | None, int, bool]:
    """(operations, how many, whether to merge them); None when the analysis has no times.

    Operations to merge are read with only the columns merging needs.
    """
    names = set(activity.collect_schema().names())
    if not set(SPAN_COLUMNS) <= names:
        return None, 0, False
    n_ops = int(activity.select(pl.len()).collect().item())
    merge = merge_gap_ns is not None or n_ops > max_ops
    exprs = [
        pl.col(c) if c in names else pl.lit(None).alias(c)
        for c in (SPAN_COLUMNS if merge else OP_COLUMNS)
    ]
    fills = [
        pl.col("device").cast(pl.String).fill_null("unknown device"),
        pl.col("stream").fill_null(-1),
        pl.col("pid").fill_null(-1),
        pl.col("^name$").cast(pl.String),
    ]
    return activity.select(exprs).with_columns(fills).collect(), n_ops, merge


def _counters(
    analysis: Analysis, spans: pl.DataFrame, gpus: pl.DataFrame
) -> tuple[pl.DataFrame, int]:
    """Counter samples ``pid_v, name, key, t_ns, value``: power (W) and busy fraction per GPU."""
    busy, width = busy_fraction(spans)
    parts = [busy.with_columns(name=pl.lit("GPU busy"), key=pl.lit("fraction"))]
    if analysis.power_samples is not None:
        power = pl.col("power_w").cast(pl.Float64)
        samples = analysis.power_samples.filter(power.is_finite())
        power_w = [pl.lit("power").alias("name"), pl.lit("W").alias("key"), power.alias("value")]
        parts.insert(0, samples.select("device", pl.col("t_ns").cast(pl.Int64), *power_w))
    counters = pl.concat(parts, how="diagonal").join(gpus, on="device", maintain_order="left")
    return counters.select("pid_v", "name", "key", "t_ns", "value"), width


def _step_instants(steps: pl.DataFrame) -> list[Event]:
    """``step N`` and ``step N end``: instants across the whole trace (global scope)."""
    return [
        dict(ph="i", s="g", pid=1, name=name, cat="step", ts=us(t), args={"step": step})
        for step, start, end in steps.select("step", "step_start_ns", "step_end_ns").iter_rows()
        for name, t in ((f"step {step}", start), (f"step {step} end", end))
    ]


def _merge_ops(
    spans: pl.DataFrame, n_ops: int, max_ops: int, merge_gap_ns: int | None
) -> tuple[pl.DataFrame, str, dict[str, Any]]:
    """Each stream's operations as busy blocks: (blocks, the note, ``otherData``'s ``merged``)."""
    gap = merge_gap_ns if merge_gap_ns is not None else choose_gap(spans, max_ops)
    blocks = merge_blocks(spans, gap)
    merged = {"n_ops": n_ops, "n_blocks": blocks.height, "gap_ns": gap, "max_ops": max_ops}
    why = f"> --max-ops {max_ops:,}" if n_ops > max_ops else "(--merge-gap-us)"
    gap_us = f"{gap / 1000:,.3f}".rstrip("0").rstrip(".")
    how = f"{n_ops:,} GPU operations {why}: merged per stream into {blocks.height:,} busy blocks"
    how += f" (operations < {gap_us} µs apart joined; busy time kept)"
    if n_ops > max_ops and merge_gap_ns is None:
        how += f"; --max-ops {n_ops} draws each operation"
    return blocks, how, merged


def build_timeline(
    analysis: Analysis,
    *,
    max_ops: int,
    merge_gap_ns: int | None = None,
    max_ranges: int = 10**12,
) -> Timeline:
    """The run's trace events: ranges, GPU operations, counters, steps.

    One slice per NVTX range (the longest ``max_ranges``); GPU operations merged per stream
    past ``max_ops`` (or at ``merge_gap_ns``).
    """
    ops, n_ops, merge = _collect_ops(analysis.gpu_activity, max_ops, merge_gap_ns)
    notes, how, merged = [], "one slice per operation", None
    if ops is None:
        notes.append(
            how := "GPU operations not shown: the analysis lacks their times; give its traces"
        )
        ops = pl.DataFrame(schema=NO_OPS)
    spans = ops.select(SPAN_COLUMNS)
    ranks, gpus, meta = _processes(analysis, spans)
    ranges, range_notes, range_other = timeline_ranges(analysis, ranks, max_ranges)
    if merge:
        ops, how, merged = _merge_ops(spans, n_ops, max_ops, merge_gap_ns)
        notes.append(how)
    ops, op_meta = _op_slices(ops, gpus)
    counters, width = _counters(analysis, spans, gpus)
    other = {
        "tool": "nvtx-phases timeline",
        "clock": "µs on the run's clock (ns since the earliest file's session start, / 1000)",
        "traces": [t.label for t in analysis.summary.traces],
        **range_other,
        "n_gpu_ops": n_ops,
        "gpu_ops": how,
        "merged": merged,
        "n_power_samples": counters.filter(pl.col("name") == "power").height,
        "busy_bin_ns": width,
        "n_steps": analysis.steps.height,
    }
    slices, range_meta = [ops], []
    if ranges is not None:
        slices, range_meta = [ranges.slices, ops], ranges.meta
    instants = _step_instants(analysis.steps)
    return Timeline(
        meta + range_meta + op_meta, slices, counters, instants, other, range_notes + notes
    )


def write_timeline(timeline: Timeline, path: str | Path) -> Path:
    """Write the trace JSON atomically, gzipped when the name ends in ``.gz``."""
    path = Path(path)

    def lines() -> Iterator[str]:
        yield '{"traceEvents":[\n'
        for i, event in enumerate(timeline.events()):
            yield ",\n"[: 2 * bool(i)] + json.dumps(event, separators=(",", ":"), allow_nan=False)
        yield '\n],\n"otherData":' + json.dumps(timeline.other_data, allow_nan=False) + "}\n"

    def write(tmp: Path) -> None:
        with tmp.open("wb") as raw:
            gz = path.name.endswith(".gz")
            sink = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if gz else raw
            with io.TextIOWrapper(sink, encoding="utf-8") as out:
                out.writelines(lines())

    return atomic_write(path, write)
