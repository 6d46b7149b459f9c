"""``analyze``: export files → phase table, GPU activity, kernel table and summary.

Read each file (map: ranges whole, GPU operations streamed, linked to their launches and
spilled to Parquet past ``chunk_ops``), put all files on one clock, cut the run into time
buckets of about ``chunk_ops`` operations, then attribute over the whole run (reduce, in
:mod:`analysis.attribute.buckets`): the window scheme needs every process's ranges at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..aggregate.staleness import staleness_table
from ..attribute.buckets import Attributed, Bucket, attribute_buckets
from ..attribute.pool_outputs import PoolInputs
from ..energy.samples import PowerData, align, load_samples
from ..errors import InputError, NothingToAnalyze, OutputError
from ..frames import concat_or_empty
from ..model import Analysis
from ..normalize.events import MARKS_SCHEMA, NO_RANGES_HINT, RANGES_SCHEMA
from ..normalize.launches import duplicate_warning, orphan_warning
from ..options import AnalyzeOptions, options_from
from ..read.export import trace_stem
from ..step_spec import parse_steps
from .clocks import check_combinable, clock_offsets
from .inputs import resolve_trace_inputs
from .load import LoadedTrace, load_all, shifted
from .memory import with_memory
from .metrics import with_gpu_metrics
from .provenance import finished, started
from .run_summary import run_summary

__all__ = ["analyze", "bucket_edges", "find_power_files"]


def find_power_files(paths: Sequence[Path]) -> list[Path]:
    """Sampler Parquet files that belong to these traces.

    Those are ``<stem>.power.parquet`` beside a trace, and ``power_*.parquet`` in a trace's
    folder (where ``nvtx-phases profile`` puts them).
    """
    found: list[Path] = []
    for path in paths:
        for candidate in (
            path.with_name(trace_stem(path) + ".power.parquet"),
            *sorted(path.parent.glob("power_*.parquet")),
        ):
            if candidate.exists() and candidate not in found:
                found.append(candidate)
    return found


def analyze(
    paths: str | Path | Sequence[str | Path],
    options: AnalyzeOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    on_file_done: Callable[[str], None] | None = None,
    **changes: Any,
) -> Analysis:
    """Analyze one run: its nsys exports (one per process or node), as the CLI takes them.

    ``paths``: SQLite exports, parquetdir folders, PyTorch profiler (Kineto) traces,
    ``.nsys-rep``/``.qdrep`` reports (exported first, the export cached) and folders of them, as
    a path or a list. ``options`` (:class:`~analysis.options.AnalyzeOptions`) or keywords
    naming its fields (``analyze(paths, jobs=4, steps="2:")``; with both, the
    keywords change ``options``); an unknown name is an ``InputError``. ``progress``: called
    with a line per stage; ``on_file_done``: with each export's name when it is read.
    ``power_files`` (an option) also takes power logs (nvidia-smi CSV, ``dcgmi dmon``, Zeus).
    Files that are not one run (capture windows apart, or the same process in two files) are
    refused unless ``force_combine`` (:func:`analysis.run.clocks.check_combinable`).
    """
    opts = options_from(options, changes)
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise InputError("no input: give the run's exports, reports, traces or their folder")
    files = resolve_trace_inputs([Path(p) for p in paths], notify=progress)
    provenance = started(files, opts)
    try:
        work = Path(tempfile.mkdtemp(prefix="nvtx-phases-", dir=opts.spill_dir))
    except OSError as exc:
        raise OutputError(
            f"spill folder {opts.spill_dir or tempfile.gettempdir()}: cannot make a work folder "
            f"there ({exc.strerror or exc}); pass --spill-dir with a writable folder"
        ) from None
    try:
        result = _analyze(files, work, opts, progress=progress, on_file_done=on_file_done)
        result = with_gpu_metrics(result, progress or (lambda _message: None))
        result = with_memory(result, progress or (lambda _message: None))
        # the notes are complete here: summary.json saves them beside the warnings
        summary = dataclasses.replace(result.summary, notes=list(result.notes))
        result = dataclasses.replace(result, summary=summary)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    # the operations spilled while reading are done with; activity parts (if any) back
    # result.gpu_activity and go when the result is closed
    shutil.rmtree(work / "ops", ignore_errors=True)
    if result.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    result = finished(result, provenance, opts)
    if opts.steps:
        from .select import select_run

        result = select_run(result, parse_steps(opts.steps))
    return result


def _analyze(
    paths: list[Path],
    work: Path,
    opts: AnalyzeOptions,
    *,
    progress: Callable[[str], None] | None,
    on_file_done: Callable[[str], None] | None,
) -> Analysis:
    say = progress or (lambda _message: None)
    say(f"reading {len(paths)} export(s)")
    (work / "ops").mkdir()
    loaded = load_all(
        paths,
        _unique_labels(paths),
        jobs=opts.jobs,
        engine=opts.engine,
        on_done=on_file_done,
        chunk_ops=opts.chunk_ops,
        spill_dir=work / "ops",
    )
    _refuse_empty(loaded)
    offsets, warnings = clock_offsets(loaded)
    warnings += check_combinable(loaded, force=opts.force_combine)
    warnings += [w for trace in loaded for w in trace.warnings]
    ranges = concat_or_empty(
        [shifted(t.ranges, offsets[t.label], ("start_ns", "end_ns")) for t in loaded],
        RANGES_SCHEMA,
    )
    marks = concat_or_empty(
        [shifted(t.marks, offsets[t.label], ("ts_ns",)) for t in loaded], MARKS_SCHEMA
    )
    power_paths = (
        [Path(p) for p in opts.power_files]
        if opts.power_files is not None
        else find_power_files(paths)
    )
    power = _aligned_power(power_paths, marks, loaded, offsets, say) if power_paths else None
    if power is not None:
        warnings += power.warnings
    edges = bucket_edges(
        [t.ops.start_sample + offsets[t.label] for t in loaded],
        sum(t.ops.n_ops for t in loaded),
        opts.chunk_ops,
    )
    activity_dir = work / "activity" if len(edges) > 1 else None
    # each file's capture end on the run's clock: where nsys closes ranges still open
    ends = {t.label: t.duration_ns + offsets[t.label] for t in loaded if t.duration_ns is not None}
    attributed = attribute_buckets(
        ranges,
        pl.concat([t.ops.launch_threads for t in loaded]).unique(),
        sorted({d for t in loaded for d in t.ops.devices}),
        _buckets(loaded, offsets, edges, say),
        opts.resolved_phase_map,
        power=power,
        idle_power_w=opts.idle_power_w,
        launch_warnings=_launch_warnings(loaded),
        activity_dir=activity_dir,
        thread_names=pl.concat([t.thread_names for t in loaded]),
        capture_ends=ends,
        pool_inputs=_pool_inputs(loaded, marks, opts),
    )
    warnings += attributed.warnings + _coverage_warnings(ranges, attributed)
    summary = run_summary(
        attributed,
        loaded,
        (offsets, ends),
        warnings,
        n_ranges=ranges.height,
        n_buckets=len(edges),
        power_files=[str(p) for p in power_paths],
    )
    return Analysis(
        **attributed.tables(),
        staleness=staleness_table(marks),
        summary=summary,
        workdir=work if activity_dir is not None and activity_dir.exists() else None,
    )


def _pool_inputs(
    loaded: Sequence[LoadedTrace], marks: pl.DataFrame, opts: AnalyzeOptions
) -> PoolInputs:
    """What tells the run's GPU pools: marks, each process's GPUs and name, the pools given."""
    return PoolInputs(
        marks=marks,
        process_devices=pl.concat([t.ops.process_devices for t in loaded]),
        process_names=pl.concat([t.process_names for t in loaded]),
        given=opts.resolved_pools,
    )


def _aligned_power(
    power_paths: list[Path],
    marks: pl.DataFrame,
    loaded: Sequence[LoadedTrace],
    offsets: dict[str, int],
    say: Callable[[str], None],
) -> PowerData:
    say("aligning power samples")
    known = [t.clock_zero_utc_ns for t in loaded if t.clock_zero_utc_ns is not None]
    # the capture on the run's clock: power logs are limited to it (when every file knows its own)
    spans = [
        (offsets[t.label], offsets[t.label] + t.duration_ns)
        for t in loaded
        if t.duration_ns is not None
    ]
    whole = len(spans) == len(loaded)
    return align(
        load_samples(power_paths),
        marks,
        origin_utc_ns=min(known) if known else None,
        op_devices=sorted({d for t in loaded for d in t.ops.devices}),
        aliases=device_aliases(loaded),
        capture_span_ns=(min(s for s, _ in spans), max(e for _, e in spans)) if whole else None,
    )


def _launch_warnings(loaded: Sequence[LoadedTrace]) -> list[str]:
    n_ops = sum(t.ops.n_ops for t in loaded)
    return duplicate_warning(sum(t.n_duplicated_calls for t in loaded)) + orphan_warning(
        sum(t.ops.n_orphans for t in loaded), n_ops, sum(t.n_calls for t in loaded)
    )


def _buckets(
    loaded: Sequence[LoadedTrace],
    offsets: dict[str, int],
    edges: list[tuple[int | None, int | None]],
    say: Callable[[str], None],
) -> Iterator[Bucket]:
    """Each time bucket's operations from every file, on the run's clock, with run-wide op ids."""
    bases = dict(
        zip(
            [t.label for t in loaded],
            itertools.accumulate([0, *(t.ops.n_ops for t in loaded)]),
            strict=False,
        )
    )
    say(
        f"attributing {sum(t.ops.n_ops for t in loaded):,} GPU operations in {len(edges)} bucket(s)"
    )
    # each file's buckets in time order (spilled operations are numbered as they are read)
    per_file = zip(*(t.ops.in_buckets(edges, offsets[t.label]) for t in loaded), strict=True)
    for number, ((lo, hi), files) in enumerate(zip(edges, per_file, strict=True), start=1):
        if len(edges) > 1:
            say(f"attributing time bucket {number}/{len(edges)}")
        parts = [
            part.with_columns((pl.col("op_local") + bases[t.label]).alias("op_id"))
            for t, part in zip(loaded, files, strict=True)
        ]
        # each part is in op_local order and the bases grow with the file: already in op_id
        # order, so no sort (a gather of every column: 0.4 s per million operations)
        ops = pl.concat(parts).drop("op_local").set_sorted("op_id")
        yield Bucket(lo, hi, ops)


def _refuse_empty(loaded: Sequence[LoadedTrace]) -> None:
    """One line instead of empty tables when no file holds an NVTX range or a GPU operation."""
    if any(t.ranges.height or t.ops.n_ops for t in loaded):
        return
    names = ", ".join(t.path.name for t in loaded)
    # NVTX that holds only domain events: the cause has a known fix, say it
    cause = next((w for t in loaded for w in t.warnings if NO_RANGES_HINT in w), None)
    if cause is not None:
        raise NothingToAnalyze(f"nothing to analyze: {cause}")
    missing = sorted({m for t in loaded for m in t.missing_tables})
    raise NothingToAnalyze(
        f"{names}: nothing to analyze: no NVTX range and no GPU operation"
        + (f" (the capture has no {', '.join(missing)})" if missing else "")
        + "; capture with --trace=cuda,nvtx"
    )


def device_aliases(loaded: Sequence[LoadedTrace]) -> dict[str, str]:
    """``host:deviceId`` → device name, for power samples that carry only an NVML index.

    Only pairs that name one GPU: under Ray every process's GPU is device 0, so those are left out.
    """
    seen: dict[str, set[str]] = {}
    for trace in loaded:
        described = dict(
            zip(trace.gpu_identities["device"], trace.gpu_identities["device_id"], strict=True)
        )
        for device in trace.ops.devices:
            index = described.get(device, device.rsplit(":", 1)[-1])
            seen.setdefault(f"{trace.host}:{index}", set()).add(device)
    return {alias: next(iter(d)) for alias, d in seen.items() if len(d) == 1}


def _coverage_warnings(ranges: pl.DataFrame, result: Attributed) -> list[str]:
    """Say why a table is empty or why GPU time has no detail, instead of staying silent."""
    warnings = []
    if ranges.height and not result.phases.height:
        # the most frequent names; ties by name, not by which range came first
        counts = ranges["name"].value_counts(name="n")
        names = counts.sort(["n", "name"], descending=[True, False]).head(5)["name"].to_list()
        warnings.append(
            f"{ranges.height} NVTX range(s) (e.g. {', '.join(repr(n) for n in names)}) but none "
            "is a known phase: pass --all-ranges, or --phase-map FILE.toml naming yours"
        )
    n_graphs = result.gpu.n_graphs
    if n_graphs:
        warnings.append(
            f"{n_graphs} CUDA graph launch(es) ({result.gpu.graph_ns / 1e6:.3f} ms) were "
            "recorded whole (--cuda-graph-trace=graph): counted as class cuda_graph; per-kernel "
            "detail inside graphs needs --cuda-graph-trace=node"
        )
    return warnings


def bucket_edges(
    samples: Sequence[pl.Series], n_ops: int, chunk_ops: int
) -> list[tuple[int | None, int | None]]:
    """Time buckets ``[lo, hi)`` (None: open end) of about ``chunk_ops`` operations each.

    Edges are placed on quantiles of the sampled start times; the result never depends on
    where they fall (tested), only the memory held at once does.
    """
    if n_ops <= chunk_ops:
        return [(None, None)]
    starts = pl.concat(list(samples)).sort()
    n_buckets = -(-n_ops // chunk_ops)
    picks = [starts[(len(starts) * k) // n_buckets] for k in range(1, n_buckets)]
    cuts = sorted(set(int(p) for p in picks))
    bounds: list[int | None] = [None, *cuts, None]
    return list(itertools.pairwise(bounds))


def _unique_labels(paths: list[Path]) -> list[str]:
    """File stems, made unique with the parent folder name where two files share a stem.

    A parquetdir folder's stem is the report's name (``X_pqtdir`` and ``X.parquetdir``: ``X``).
    """
    stems = [trace_stem(p) for p in paths]
    return [
        f"{p.parent.name}/{stem}" if stems.count(stem) > 1 else stem
        for p, stem in zip(paths, stems, strict=True)
    ]
