"""GPU work launched from threads without a projection range: counted, and warned about.

Under projection an operation belongs to the ranges of the thread that launched it. PyTorch
launches backward kernels from its autograd thread (``pt_autograd_0``), which marks no NVTX
range, so a process's ``Backward`` range can read 0 % busy while its GPU is full; operations
whose launching CUDA call the export lacks (a capture cut mid-run) have no thread at all. Both
stay unattributed under projection. When they are a noticeable share of the run's GPU time, in
a process that does mark projection ranges (so its rows look idle), a warning names them and
points to the ``process_*`` columns, which count every thread's work inside each range.
"""

from __future__ import annotations

import polars as pl

from ..normalize.events import tid_of

#: share of the run's GPU time from which unattributed launches are warned about
WARN_SHARE = 0.05
_KEYS = ["trace", "pid", "gtid"]


class ThreadSums:
    """Operations and GPU time per launching thread (``gtid`` null: no launching call found)."""

    def __init__(self) -> None:
        self._parts: list[pl.DataFrame] = []

    def add(self, ops: pl.DataFrame) -> None:
        """Count one bucket's operations by (trace, pid, launching thread)."""
        self._parts.append(
            ops.group_by(_KEYS).agg(
                pl.len().cast(pl.Int64).alias("n_ops"),
                (pl.col("end_ns") - pl.col("start_ns")).sum().alias("gpu_ns"),
            )
        )

    def per_thread(self) -> pl.DataFrame:
        """``trace, pid, gtid, n_ops, gpu_ns`` over every bucket."""
        if not self._parts:
            return pl.DataFrame(
                schema={
                    "trace": pl.String,
                    "pid": pl.Int64,
                    "gtid": pl.Int64,
                    "n_ops": pl.Int64,
                    "gpu_ns": pl.Int64,
                }
            )
        return pl.concat(self._parts).group_by(_KEYS).agg(pl.col("n_ops", "gpu_ns").sum())

    def warnings(
        self,
        ranges: pl.DataFrame,
        proj_ranges: pl.DataFrame,
        thread_names: pl.DataFrame | None,
        total_gpu_ns: int,
    ) -> list[str]:
        """One line per thread (or per process's launches without a call) past :data:`WARN_SHARE`.

        Only in processes with projection ranges. ``ranges``: every NVTX range of the run (to
        tell a thread without any range from one whose ranges are not phases).
        """
        if total_gpu_ns <= 0 or proj_ranges.is_empty():
            return []
        marked = proj_ranges.select("trace", "pid").unique()
        ranged = proj_ranges.select("trace", "gtid").unique()
        found = (
            self.per_thread()
            .join(marked, on=["trace", "pid"], how="semi")
            .join(ranged, on=["trace", "gtid"], how="anti")
            .filter(pl.col("gpu_ns") >= WARN_SHARE * total_gpu_ns)
            .join(_named(thread_names), on=["trace", "gtid"], how="left")
            .join(
                ranges.group_by("trace", "gtid").agg(pl.len().alias("n_nvtx")),
                on=["trace", "gtid"],
                how="left",
            )
            .with_columns(tid_of(pl.col("gtid")).alias("tid"))
            .sort("gpu_ns", "trace", "pid", "gtid", descending=[True, False, False, False])
        )
        return [_line(row, total_gpu_ns) for row in found.iter_rows(named=True)]


def _named(thread_names: pl.DataFrame | None) -> pl.DataFrame:
    if thread_names is None:
        return pl.DataFrame(schema={"trace": pl.String, "gtid": pl.Int64, "thread_name": pl.String})
    return thread_names.select("trace", "gtid", "thread_name").unique(
        subset=["trace", "gtid"], keep="first"
    )


def _line(row: dict, total_gpu_ns: int) -> str:
    share = 100 * row["gpu_ns"] / total_gpu_ns
    work = (
        f"{row['n_ops']:,} operation(s), {row['gpu_ns'] / 1e6:.1f} ms ({share:.1f} % of GPU time)"
    )
    if row["gtid"] is None:
        return (
            f"{row['trace']}: {work} of pid {row['pid']} have no launching CUDA API call in the "
            "export (no thread to project them by): under projection they are unattributed; "
            "see the process_* columns"
        )
    name = f" ({row['thread_name']})" if row.get("thread_name") else ""
    ranges = (
        "has no NVTX range"
        if not row.get("n_nvtx")
        else f"has {row['n_nvtx']:,} NVTX range(s), none of them a phase "
        "(--all-ranges, --phase-map)"
    )
    return (
        f"{row['trace']}: thread {row['tid']}{name} of pid {row['pid']} launched {work} and "
        f"{ranges}: under projection they are unattributed; see the process_* columns"
    )
