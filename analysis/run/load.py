"""The per-file half of ``analyze``: read and normalize each export, serially or in parallel.

Each file is read and normalized on its own session clock (:func:`load_trace`), which needs
nothing from the other files, so it runs in a process pool (``jobs``) or as Ray tasks on an
existing cluster (``engine="ray"``; files must be readable where the tasks run, e.g. a shared
file system). Shifting onto the run's clock happens afterwards, once every session start is known.
Every engine gives the same frames: results are ordered by input position, not completion.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl

from ..attribute.pools import PROCESS_NAME_SCHEMA
from ..errors import AnalysisError, MissingDependency
from ..frames import PolarsDataType
from ..normalize.devices import gpu_identities, unidentified_warning
from ..normalize.events import (
    OP_TABLES,
    RUNTIME_SCHEMA,
    gpu_op_rows,
    nvtx_marks,
    nvtx_ranges,
    runtime_rows,
    strings_of,
)
from ..normalize.launches import CallIndex
from ..options import DEFAULT_CHUNK_OPS, Engine
from ..read import specs as T
from ..read.export import Export, RawTrace, read_export
from ..read.prefetch import Prefetched, in_threads
from .spill import BATCH_ROWS, OpsStore, collect_ops

#: how files are read: one after another, in a process pool, or as Ray tasks

#: the columns of :attr:`LoadedTrace.thread_names`
THREAD_NAMES: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "gtid": pl.Int64,
    "thread_name": pl.String,
}


@dataclass
class LoadedTrace:
    """One export on its own clock: phase ranges, marks, operations and run metadata."""

    path: Path
    label: str
    nsys_version: str
    host: str
    session_start_utc_ns: int | None
    #: UTC ns of this file's timestamp zero (see :mod:`analysis.run.clocks`)
    clock_zero_utc_ns: int | None
    missing_tables: list[str]
    #: GPU model names the report lists
    gpus: list[str]
    #: the physical GPUs this file's operations ran on (:data:`analysis.normalize.devices.IDENTITY_SCHEMA`)
    gpu_identities: pl.DataFrame
    duration_ns: int | None
    #: processes with any NVTX range or GPU operation
    pids: list[int]
    driver_version: str
    ranges: pl.DataFrame
    marks: pl.DataFrame
    ops: OpsStore
    n_calls: int
    n_duplicated_calls: int
    #: ``trace, gtid, thread_name`` from the export's ``ThreadNames`` (empty without it)
    thread_names: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=THREAD_NAMES))
    #: ``trace, pid, process_name`` from the export's ``PROCESSES`` (empty without it)
    process_names: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=PROCESS_NAME_SCHEMA)
    )
    warnings: list[str] = field(default_factory=list)


def thread_names(raw: RawTrace) -> pl.DataFrame:
    """``trace, gtid, thread_name`` of the export's named threads (empty without ThreadNames)."""
    names = raw.frame(T.THREAD_NAMES)
    if names is None or names.is_empty():
        return pl.DataFrame(schema=THREAD_NAMES)
    strings = strings_of(raw).rename({"id": "nameId", "value": "thread_name"})
    return (
        names.select(pl.col("nameId").cast(pl.Int64), pl.col("globalTid").cast(pl.Int64))
        .join(strings, on="nameId", how="inner")
        .select(pl.lit(raw.label).alias("trace"), pl.col("globalTid").alias("gtid"), "thread_name")
        .unique(subset=["gtid"], keep="last", maintain_order=True)
        .cast(THREAD_NAMES)  # type: ignore[arg-type]
    )


def process_names(raw: RawTrace) -> pl.DataFrame:
    """``trace, pid, process_name`` of the export's named processes (empty without PROCESSES)."""
    processes = raw.frame(T.PROCESSES)
    if processes is None or processes.is_empty() or "name" not in processes.columns:
        return pl.DataFrame(schema=PROCESS_NAME_SCHEMA)
    return (
        processes.select(
            pl.lit(raw.label).alias("trace"),
            pl.col("pid").cast(pl.Int64),
            pl.col("name").cast(pl.String).alias("process_name"),
        )
        .drop_nulls()
        .unique(subset=["pid"], keep="last", maintain_order=True)
    )


#: Threads that read one file's runtime-call table, each a rowid slice of it.
READ_THREADS = 2
#: Operation batches read ahead of the linking and spilling (about 25 MB each).
READ_AHEAD = 4


def _slices(span: tuple[int, int] | None, n: int) -> list[tuple[int, int] | None]:
    if span is None:
        return [None]
    lo, hi = span
    cuts = [lo + (hi - lo) * k // n for k in range(n + 1)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a] or [None]


def _runtime(path: Path, label: str) -> pl.DataFrame:
    """The launching calls (runtime layout), read as rowid slices on :data:`READ_THREADS`."""
    export = Export(path)
    try:
        span = export.rowid_span(T.RUNTIME)
    finally:
        export.close()

    def read(rowids: tuple[int, int] | None) -> list[pl.DataFrame]:
        # one connection per thread: SQLite connections are not shared across threads here
        part = Export(path)
        try:
            return [
                runtime_rows(batch, label=label)
                for batch in part.batches(T.RUNTIME, BATCH_ROWS, rowids=rowids)
            ]
        finally:
            part.close()

    frames = [
        f for part in in_threads(read, _slices(span, READ_THREADS), READ_THREADS) for f in part
    ]
    frames = [f for f in frames if f.height]
    return pl.concat(frames) if frames else pl.DataFrame(schema=RUNTIME_SCHEMA)


def _op_batches(
    path: Path, raw: RawTrace, identities: pl.DataFrame, backwards: Counter[str]
) -> Iterator[pl.DataFrame]:
    """The export's GPU operations in the ops layout, batch by batch.

    Operations that end before they start are left out and counted per kind in ``backwards``:
    a negative duration would subtract from every total it entered.
    """
    strings = strings_of(raw)
    export = Export(path)
    try:
        for kind, spec in OP_TABLES.items():
            for batch in export.batches(spec, BATCH_ROWS):
                rows = gpu_op_rows(kind, batch, strings, label=raw.label, identities=identities)
                n_backwards = int((rows["end_ns"] < rows["start_ns"]).sum())
                if n_backwards:  # filtered only then: no copy of every well-formed batch
                    backwards[kind] += n_backwards
                    rows = rows.filter(pl.col("end_ns") >= pl.col("start_ns"))
                yield rows
    finally:
        export.close()


def backwards_warning(label: str, backwards: Counter[str]) -> list[str]:
    """One warning naming how many operations of each kind ended before they started."""
    if not backwards:
        return []
    counts = ", ".join(f"{n:,} {kind}" for kind, n in sorted(backwards.items()))
    return [
        f"{label}: {counts} operation(s) end before they start (negative duration); "
        "left out of every table and total"
    ]


def load_trace(
    path: str | Path,
    label: str,
    *,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    spill_dir: str | Path | None = None,
) -> LoadedTrace:
    """Read one export (offset 0): ranges and marks whole, operations in batches.

    Operations are linked to their launching calls here, per file; past ``chunk_ops`` of them
    they go to Parquet parts in ``spill_dir`` (see :mod:`analysis.run.spill`). The operation
    tables are read in a background thread, starting while the runtime calls are read.
    """
    path = Path(path)
    raw = read_export(path, label=label, streamed=(*OP_TABLES.values(), T.RUNTIME))
    ranges, range_warnings = nvtx_ranges(raw)
    identities = gpu_identities(raw)
    backwards: Counter[str] = Counter()
    with Prefetched(
        lambda: _op_batches(path, raw, identities, backwards), depth=READ_AHEAD
    ) as op_batches:
        calls = CallIndex.build(_runtime(path, label))
        ops = collect_ops(
            label,
            op_batches,
            calls,
            chunk_ops=chunk_ops,
            spill_dir=Path(spill_dir) if spill_dir is not None else None,
        )
    warnings = list(raw.warnings)
    if raw.missing_tables:
        warnings.append(f"{raw.label}: no {', '.join(raw.missing_tables)} (not captured)")
    warnings += backwards_warning(raw.label, backwards)
    warnings += unidentified_warning(label, ops.devices, identities)
    used = identities.filter(pl.col("device").is_in(ops.devices))
    return LoadedTrace(
        path=Path(path),
        label=label,
        nsys_version=raw.nsys_version,
        host=raw.host,
        session_start_utc_ns=raw.session_start_utc_ns,
        clock_zero_utc_ns=raw.clock_zero_utc_ns,
        missing_tables=raw.missing_tables,
        gpus=sorted(str(n) for n in identities["gpu_name"].drop_nulls().unique()),
        gpu_identities=used.with_columns(pl.lit(raw.host).alias("host")),
        duration_ns=raw.duration_ns,
        pids=sorted(set(ranges["pid"].unique().to_list()) | set(ops.pids)),
        driver_version=raw.driver_version,
        ranges=ranges,
        marks=nvtx_marks(raw),
        ops=ops,
        n_calls=calls.n_calls,
        n_duplicated_calls=calls.n_duplicated,
        thread_names=thread_names(raw),
        process_names=process_names(raw),
        warnings=warnings + range_warnings,
    )


def shifted(frame: pl.DataFrame, offset_ns: int, columns: Sequence[str]) -> pl.DataFrame:
    """``frame`` with ``columns`` moved by ``offset_ns`` (onto the run's clock)."""
    if offset_ns == 0:
        return frame
    return frame.with_columns(pl.col(c) + offset_ns for c in columns)


def load_all(
    paths: Sequence[Path],
    labels: Sequence[str],
    *,
    jobs: int = 1,
    engine: Engine = "process",
    on_done: Callable[[str], None] | None = None,
    chunk_ops: int = DEFAULT_CHUNK_OPS,
    spill_dir: Path | None = None,
) -> list[LoadedTrace]:
    """Load every export; ``jobs > 1`` (or ``engine="ray"``) runs files in parallel.

    ``spill_dir`` must be readable by this process wherever the loads run (with Ray on a
    cluster: a shared file system, like the exports themselves).
    """
    options: dict[str, Any] = {"chunk_ops": chunk_ops, "spill_dir": spill_dir}
    load = partial(load_trace, chunk_ops=chunk_ops, spill_dir=spill_dir)
    if engine == "ray":
        return _load_ray(options, paths, labels, on_done)
    if jobs <= 1 or len(paths) <= 1 or engine == "serial":
        loaded = []
        for path, label in zip(paths, labels, strict=True):
            loaded.append(load(path, label))
            if on_done:
                on_done(label)
        return loaded
    # spawn, not fork: forking a process that runs Polars' thread pool can deadlock
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(paths)), mp_context=get_context("spawn")
    ) as pool:
        futures = [
            pool.submit(load, path, label) for path, label in zip(paths, labels, strict=True)
        ]
        loaded = []
        for future, label in zip(futures, labels, strict=True):
            loaded.append(future.result())  # re-raises the file's AnalysisError here
            if on_done:
                on_done(label)
        return loaded


def _load_ray(
    options: dict[str, Any],
    paths: Sequence[Path],
    labels: Sequence[str],
    on_done: Callable[[str], None] | None,
) -> list[LoadedTrace]:
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency("--engine ray needs Ray: pip install nvtx-phases[ray]") from exc
    if not ray.is_initialized():
        # an existing cluster when RAY_ADDRESS says where; otherwise a local instance
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or None,
            include_dashboard=False,
            log_to_driver=False,
        )
    task = ray.remote(load_trace)
    refs = [
        task.remote(str(path), label, **options) for path, label in zip(paths, labels, strict=True)
    ]
    loaded = []
    for ref, label in zip(refs, labels, strict=True):
        try:
            loaded.append(ray.get(ref))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), AnalysisError) else None
            if cause is not None:
                raise cause from None
            raise
        if on_done:
            on_done(label)
    return loaded
