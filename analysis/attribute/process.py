"""The GPU work of a projection range's whole process inside the range (``process_*`` columns).

Under projection a range owns the operations launched from its own thread only. PyTorch runs
backward kernels from its autograd thread, which marks no NVTX range: a ``Backward`` range then
reads 0 % busy while its process keeps the GPU full. For every projection range these columns
say what the range's *process* (same trace and pid, any thread, operations whose launching call
is missing included: nsys records the process on the operation itself) ran on the GPU inside
the range's interval:

- ``process_gpu_ns``: the process's operations (kernels incl. NCCL, memcpy, memset, CUDA graph
  executions), each clipped to the interval, summed;
- ``process_gpu_busy_ns``: per device, the union of those clipped operations, summed over
  devices;
- ``process_n_devices``: the devices the process ran operations on anywhere in the run;
- ``process_idle_ns = wall_ns × process_n_devices − process_gpu_busy_ns``.

How: each process's projection-range starts and ends cut its time line into elementary
segments; its operations are split at them
(:func:`~analysis.attribute.intervals.split_at_segments`), sums and busy unions (:class:`~analysis.attribute.intervals.BusyAccumulator`, so any bucketing
gives the one-pass result) are kept per (process, segment, device), and a range's figures are
sums over the segments inside it, which are disjoint (so their unions add).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..frames import PolarsDataType
from ..intervals import segment_boundaries, split_at_segments
from .intervals import BusyAccumulator
from .operations import range_segments

PROCESS = ["trace", "pid"]
_BUSY_KEYS: dict[str, PolarsDataType] = {"pseg": pl.Int64, "device": pl.String}


@dataclass(frozen=True)
class ProcessLayout:
    """Each process's segment boundaries and the segments inside its projection ranges.

    Segments are numbered run-wide (``pseg``): process ``k``'s segment ``s`` (see
    :func:`~analysis.attribute.intervals.segments_of`) is ``offset_k + s``, so one integer key
    names a (process, segment) pair.
    """

    #: (trace, pid) → (boundaries, offset of its segment numbers)
    boundaries: dict[tuple[str, int], tuple[pl.Series, int]]
    #: ``rid, pseg`` for every segment inside each projection range
    range_segments: pl.DataFrame

    @classmethod
    def of(cls, proj_ranges: pl.DataFrame) -> ProcessLayout:
        """The layout of ``proj_ranges`` (``rid, trace, pid, start_ns, end_ns``)."""
        boundaries: dict[tuple[str, int], tuple[pl.Series, int]] = {}
        inside = [pl.DataFrame(schema={"rid": pl.Int64, "pseg": pl.Int64})]
        offset = 0
        for (trace, pid), group in sorted(
            proj_ranges.partition_by(PROCESS, as_dict=True).items(), key=lambda kv: str(kv[0])
        ):
            cuts = segment_boundaries(group["start_ns"], group["end_ns"])
            boundaries[(str(trace), int(pid))] = (cuts, offset)
            inside.append(
                range_segments(group, cuts).select("rid", (pl.col("seg") + offset).alias("pseg"))
            )
            offset += cuts.len() + 1
        return cls(boundaries, pl.concat(inside))


class ProcessSums:
    """What the run keeps of each bucket for the ``process_*`` columns (see the module doc)."""

    def __init__(self, layout: ProcessLayout, devices: list[str]) -> None:
        self.layout = layout
        self._sums: list[pl.DataFrame] = []
        self._devices: list[pl.DataFrame] = []
        self._busy = BusyAccumulator(_BUSY_KEYS, devices=devices)

    def add(self, ops: pl.DataFrame, until_ns: int | None) -> None:
        """One bucket's operations (those starting before ``until_ns``)."""
        if not self.layout.boundaries:
            return
        wanted = ops.select(*PROCESS, "device", "start_ns", "end_ns")
        pieces: list[pl.DataFrame] = []
        for (trace, pid), part in wanted.partition_by(PROCESS, as_dict=True).items():
            found = self.layout.boundaries.get((str(trace), int(pid)))
            if found is not None:
                cuts, offset = found
                self._devices.append(
                    part.select(
                        pl.lit(trace, dtype=pl.String).alias("trace"),
                        pl.lit(pid, dtype=pl.Int64).alias("pid"),
                        pl.col("device").unique(),
                    )
                )
                pieces.append(
                    split_at_segments(part.drop(PROCESS), cuts)
                    .filter(pl.col("overlap_ns") > 0)
                    .select(
                        (pl.col("seg") + offset).alias("pseg"),
                        "device",
                        "overlap_ns",
                        pl.max_horizontal("start_ns", "seg_start_ns").alias("start_ns"),
                        pl.min_horizontal("end_ns", "seg_end_ns").alias("end_ns"),
                    )
                )
        if not pieces:
            return
        split = pl.concat(pieces)
        self._sums.append(split.group_by("pseg").agg(pl.col("overlap_ns").sum()))
        self._busy.add(split, until_ns)

    def metrics(self, proj_ranges: pl.DataFrame) -> pl.DataFrame:
        """``rid, process_gpu_ns, process_gpu_busy_ns, process_n_devices`` per projection range.

        Every range of ``proj_ranges`` gets a row (0 where its process ran nothing inside it).
        """
        schema = {"pseg": pl.Int64, "overlap_ns": pl.Int64}
        sums = pl.concat(self._sums) if self._sums else pl.DataFrame(schema=schema)
        per_seg = (
            sums.group_by("pseg")
            .agg(pl.col("overlap_ns").sum().alias("gpu_ns"))
            .join(
                self._busy.result().group_by("pseg").agg(pl.col("busy_ns").sum()),
                on="pseg",
                how="full",
                coalesce=True,
            )
        )
        per_range = (
            self.layout.range_segments.join(per_seg, on="pseg", how="inner")
            .group_by("rid")
            .agg(
                pl.col("gpu_ns").sum().alias("process_gpu_ns"),
                pl.col("busy_ns").sum().alias("process_gpu_busy_ns"),
            )
        )
        devices = (
            pl.concat(self._devices)
            .unique()
            .group_by(PROCESS)
            .agg(pl.col("device").n_unique().cast(pl.Int64).alias("process_n_devices"))
            if self._devices
            else pl.DataFrame(
                schema={"trace": pl.String, "pid": pl.Int64, "process_n_devices": pl.Int64}
            )
        )
        return (
            proj_ranges.select("rid", *PROCESS)
            .join(per_range, on="rid", how="left")
            .join(devices, on=PROCESS, how="left")
            .select(
                "rid",
                *(
                    pl.col(c).fill_null(0).cast(pl.Int64)
                    for c in ("process_gpu_ns", "process_gpu_busy_ns", "process_n_devices")
                ),
            )
        )
