"""The per-file half of ``analyze``: read and normalize each export, serially or in parallel.

Each file is read and normalized on its own session clock (:func:`load_trace`), which needs
nothing from the other files, so it runs in a process pool (``jobs``) or as Ray tasks on an
existing cluster (``engine="ray"``; files must be readable where the tasks run, e.g. a shared
file system). Shifting onto the run's clock happens afterwards, once every session start is known.
Every engine gives the same frames: results are ordered by input position, not completion.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Literal

import polars as pl

from analysis import tables as T
from analysis.errors import AnalysisError
from analysis.normalize import Normalized, normalize
from analysis.reader import read_export

Engine = Literal["serial", "process", "ray"]


@dataclass
class LoadedTrace:
    """One export, normalized on its own clock, with the metadata the run needs."""

    path: Path
    label: str
    nsys_version: str
    host: str
    session_start_utc_ns: int | None
    missing_tables: list[str]
    gpus: list[str]
    driver_version: str
    norm: Normalized
    warnings: list[str] = field(default_factory=list)


def load_trace(path: str | Path, label: str) -> LoadedTrace:
    """Read one export and normalize it (offset 0); keeps only what analysis needs."""
    raw = read_export(path, label=label)
    norm = normalize(raw)
    gpus = raw.frame(T.TARGET_GPU)
    warnings = list(raw.warnings)
    if raw.missing_tables:
        warnings.append(f"{raw.label}: no {', '.join(raw.missing_tables)} (not captured)")
    return LoadedTrace(
        path=Path(path),
        label=label,
        nsys_version=raw.nsys_version,
        host=raw.host,
        session_start_utc_ns=raw.session_start_utc_ns,
        missing_tables=raw.missing_tables,
        gpus=sorted(str(n) for n in gpus["name"].drop_nulls().unique())
        if gpus is not None and "name" in gpus.columns
        else [],
        driver_version=raw.driver_version,
        norm=norm,
        warnings=warnings + norm.warnings,
    )


def shift(norm: Normalized, offset_ns: int) -> Normalized:
    """The same frames with every timestamp moved by ``offset_ns`` (onto the run's clock)."""
    if offset_ns == 0:
        return norm

    def moved(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
        return frame.with_columns(pl.col(c) + offset_ns for c in columns)

    return Normalized(
        ranges=moved(norm.ranges, ("start_ns", "end_ns")),
        ops=moved(norm.ops, ("start_ns", "end_ns")),
        runtime=moved(norm.runtime, ("start_ns", "end_ns")),
        marks=moved(norm.marks, ("ts_ns",)),
        warnings=norm.warnings,
    )


def load_all(
    paths: Sequence[Path],
    labels: Sequence[str],
    *,
    jobs: int = 1,
    engine: Engine = "process",
    on_done: Callable[[str], None] | None = None,
) -> list[LoadedTrace]:
    """Load every export; ``jobs > 1`` (or ``engine="ray"``) runs files in parallel."""
    if engine == "ray":
        return _load_ray(paths, labels, on_done)
    if jobs <= 1 or len(paths) <= 1 or engine == "serial":
        loaded = []
        for path, label in zip(paths, labels, strict=True):
            loaded.append(load_trace(path, label))
            if on_done:
                on_done(label)
        return loaded
    # spawn, not fork: forking a process that runs Polars' thread pool can deadlock
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(paths)), mp_context=get_context("spawn")
    ) as pool:
        futures = [
            pool.submit(load_trace, path, label) for path, label in zip(paths, labels, strict=True)
        ]
        loaded = []
        for future, label in zip(futures, labels, strict=True):
            loaded.append(future.result())  # re-raises the file's AnalysisError here
            if on_done:
                on_done(label)
        return loaded


def _load_ray(
    paths: Sequence[Path], labels: Sequence[str], on_done: Callable[[str], None] | None
) -> list[LoadedTrace]:
    try:
        import ray
    except ImportError as exc:
        raise AnalysisError("--engine ray needs Ray: pip install nvtx-phases[ray]") from exc
    if not ray.is_initialized():
        # an existing cluster when RAY_ADDRESS says where; otherwise a local instance
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or None,
            include_dashboard=False,
            log_to_driver=False,
        )
    task = ray.remote(load_trace)
    refs = [task.remote(str(path), label) for path, label in zip(paths, labels, strict=True)]
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
