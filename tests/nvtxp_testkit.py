"""Test helpers: paths to ../shared traces and the bundled samples, and the nsys lookup.

Named uniquely (not ``tests.…``): VeRL 0.9.1 installs a top-level ``tests`` package.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.buckets import Bucket, attribute_buckets
from nvtx_phases.analysis.attribute.phase_map import PhaseMap
from nvtx_phases.analysis.model import THREAD, Analysis, RunSummary
from nvtx_phases.analysis.normalize.launches import CallIndex, duplicate_warning, orphan_warning

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "traces_sample"
SHARED = Path(os.environ.get("NVTX_PHASES_SHARED", REPO.parent / "shared"))
TRACES = SHARED / "traces"


def shared_trace(name: str) -> Path:
    """A real export from ../shared/traces (CI has that folder; skip where it is absent)."""
    return shared_path(f"traces/{name}")


def shared_path(relative: str) -> Path:
    """A file or folder of ../shared (skip where absent; fail where CI requires ../shared)."""
    path = SHARED / relative
    if not path.exists():
        if os.environ.get("NVTX_PHASES_REQUIRE_SHARED") == "1":
            pytest.fail(f"{path} is required here (NVTX_PHASES_REQUIRE_SHARED=1) but missing")
        pytest.skip(f"{path} not present (set NVTX_PHASES_SHARED)")
    return path


def find_nsys_or_skip() -> str:
    """Path of the nsys CLI; skips (or fails in CI, NVTX_PHASES_REQUIRE_NSYS=1) without it."""
    found = shutil.which("nsys")
    if found is None:
        if os.environ.get("NVTX_PHASES_REQUIRE_NSYS") == "1":
            pytest.fail("nsys is required here (NVTX_PHASES_REQUIRE_NSYS=1) but not on PATH")
        pytest.skip("nsys not on PATH (install: bash ../shared/nsys/install-debian-nsys.sh)")
    return found


SPLIT_SAMPLE = sorted((SAMPLES / "grpo_synthetic_split").glob("*.sqlite"))


def assert_same_analysis(a, b, *, ignore_summary: tuple[str, ...] = ()) -> None:
    """Two :class:`~analysis.run.pipeline.Analysis` results hold the same frames and summary.

    ``b``'s GPU activity may be a lazy scan of per-bucket parts: its rows are compared in
    ``op_id`` order. The summaries' provenance (time of analysis, options) is not compared.
    """
    assert a.phases.equals(b.phases)
    assert a.phase_devices.equals(b.phase_devices)
    assert a.kernels.equals(b.kernels)
    assert a.steps.equals(b.steps)
    assert a.gpu_activity.collect().equals(b.gpu_activity.collect().sort("op_id"))

    def kept(summary: RunSummary) -> dict:
        ignored = {*ignore_summary, "provenance"}
        return {k: v for k, v in summary.to_dict().items() if k not in ignored}

    assert kept(a.summary) == kept(b.summary)


def link_launches(
    ops: pl.DataFrame, runtime: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Each operation joined to its runtime call, as the loader does per file (for tests on frames).

    Returns the linked operations, the (trace, gtid) threads that launched any, and warnings.
    """
    linked: list[pl.DataFrame] = []
    n_duplicated = 0
    for (trace,), calls in runtime.partition_by("trace", as_dict=True).items():
        index = CallIndex.build(calls)
        n_duplicated += index.n_duplicated
        linked.append(index.link(ops.filter(pl.col("trace") == trace)))
    traces = runtime["trace"].unique().implode()
    linked.append(CallIndex.empty().link(ops.filter(~pl.col("trace").is_in(traces))))
    frame = pl.concat(linked).sort("op_id") if ops.height else CallIndex.empty().link(ops)
    warnings = duplicate_warning(n_duplicated) + orphan_warning(
        frame["gtid"].null_count(), frame.height, runtime.height
    )
    threads = frame.filter(pl.col("gtid").is_not_null()).select(THREAD).unique()
    return frame, threads, warnings


def attribute_run(
    ranges: pl.DataFrame,
    ops: pl.DataFrame,
    runtime: pl.DataFrame,
    phase_map: PhaseMap,
    *,
    edges: Sequence[int] = (),
) -> Analysis:
    """The attribution core on in-memory frames of a whole run (one clock, no files).

    ``ops`` need an ``op_id`` column. ``edges``: bucket the operations at these instants
    (the result must not change).
    """
    linked, threads, warnings = link_launches(ops, runtime)
    bounds: list[int | None] = [None, *sorted(set(edges)), None]
    buckets = (
        Bucket(
            lo,
            hi,
            linked.filter(
                (pl.col("start_ns") >= lo if lo is not None else pl.lit(True))
                & (pl.col("start_ns") < hi if hi is not None else pl.lit(True))
            ),
        )
        for lo, hi in itertools.pairwise(bounds)
    )
    done = attribute_buckets(
        ranges,
        threads,
        sorted(linked["device"].drop_nulls().unique().to_list()),
        buckets,
        phase_map,
        launch_warnings=warnings,
    )
    summary = RunSummary(
        gpu=done.gpu,
        window_timeline=done.window_timeline,
        n_phase_ranges=done.n_phase_ranges,
        n_devices=done.n_devices,
        n_steps=done.steps.height,
        energy=done.energy,
        gpus=[],
        driver_versions=[],
        traces=[],
        missing_tables=[],
        devices=[],
        n_ranges=ranges.height,
        n_buckets=1,  # the edges are a test device, not the pipeline's bucketing
        power_files=[],
        warnings=done.warnings,
    )
    return Analysis(
        phases=done.phases,
        phase_devices=done.phase_devices,
        gpu_activity=done.gpu_activity,
        kernels=done.kernels,
        steps=done.steps,
        summary=summary,
    )


def brute_quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), written out: the
    independent side of every "median / p10 / p90 over steps" a test checks."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def csv_rows(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows as text, with the standard library (no Polars on the checking side)."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def displayed(value: float, digits: int, pct: bool = False) -> str:
    """The display rule (README), written apart from the tool's: exact zero "0"; a nonzero value
    under the last digit "<0.01"; a percentage that is not 100 never "100" (more decimals)."""
    if value == 0:
        return "0"
    if round(value, digits) == 0:
        return ("-" if value < 0 else "") + "<" + f"{10.0**-digits:.{digits}f}"
    while pct and value != 100 and round(value, digits) == 100 and digits < 3:
        digits += 1
    return f"{value:,.{digits}f}"


def output_digests(
    trace: Path, out: Path, *, all_ranges: bool, name: str | None = None
) -> dict[str, object]:
    """Every file ``analyze`` writes for ``trace``, by name: its sha256 (summary.json: its parts
    but provenance and trace paths), or the one-line error. ``name``: a file name to mask."""
    import hashlib
    import json

    from nvtx_phases.analysis.errors import AnalysisError
    from nvtx_phases.analysis.jobs import analyze_to

    def masked(text: str) -> str:
        return text.replace(name, "NAME") if name else text

    try:
        analyze_to([trace], out, figures=True, power_files=[], all_ranges=all_ranges)
    except AnalysisError as exc:
        return {"error": masked(str(exc).replace(str(trace), "TRACE"))}
    found: dict[str, object] = {}
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name != "summary.json":
            found[str(path.relative_to(out))] = hashlib.sha256(path.read_bytes()).hexdigest()
    summary = json.loads(masked((out / "summary.json").read_text()))
    summary.pop("provenance")
    for entry in summary.get("traces", []):
        entry.pop("path")
    found.update({f"summary:{k}": v for k, v in summary.items()})
    return found
