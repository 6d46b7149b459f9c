"""The import step's analysis: each mode's exports analyzed with nvtx-phases, then every check.

On a dry run the GPU-only checks are listed as SKIP with "not run: needs a GPU", never passed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
from nvtx_phases.analysis import AnalysisError, analyze, write_outputs

from checks.gpu_capture.gpu_checks import (
    ModeRun,
    check_energy,
    check_events,
    check_graph_vs_node,
    check_kernels_traced,
    check_one_gpu,
)
from checks.gpu_capture.importer import import_mode
from checks.gpu_capture.model import (
    DRIVER_PHASES,
    EVENTS_FILE,
    MANIFEST,
    NEEDS_GPU,
    READS_FILE,
    Config,
)
from checks.gpu_capture.verify import (
    check_capture,
    check_driver_phases,
    check_import,
    check_wall_times,
    check_workers,
    read_recorder,
)
from checks.gpu_check.model import FAIL, SKIP, Check

GPU_ONLY = (
    "GPU work traced (CUPTI vs the device's CUDA)",
    "one physical GPU (UUID) for both workers",
    "GPU span vs CUDA events",
    "energy per phase: analysis vs counter reads",
)


def analyze_mode(folder: Path, exports: list[Path], power: Path | None) -> ModeRun:
    """The analysis of one mode's exports (tables written to ``<folder>/analysis``)."""
    events = json.loads((folder / EVENTS_FILE).read_text())
    reads_path = folder / READS_FILE
    with analyze(exports, power_files=[power] if power else ()) as run:
        write_outputs(run, folder / "analysis")
        return ModeRun(
            mode=folder.name, phases=run.phases, ranges=run.ranges,
            devices=list(run.summary.to_dict().get("devices") or []), events=events,
            recorder=read_recorder(folder), power=power,
            reads=json.loads(reads_path.read_text()) if reads_path.is_file() else [],
        )  # fmt: skip


def mode_checks(run: ModeRun, cfg: Config, gpu: bool) -> list[Check]:
    """Every check of one mode's capture (GPU-only ones SKIP on a dry run)."""
    steps, drv = cfg.sizes.steps, run.events["driver_pid"]
    checks = [
        check_driver_phases(run.mode, run.ranges, drv, steps),
        check_workers(run.mode, run.ranges, run.events.get("hellos", {}), drv, steps),
        check_wall_times(run.mode, run.ranges, run.recorder, drv, cfg),
    ]
    if not gpu:
        return checks + [Check(run.mode, name, SKIP, NEEDS_GPU) for name in GPU_ONLY]
    checks += [check_kernels_traced(run), check_one_gpu(run), *check_events(run, cfg)]
    return [*checks, check_energy(run, cfg)]


def import_step(cfg: Config) -> tuple[list[Check], dict[str, ModeRun]]:
    """Import, analyze and check every mode found in ``cfg.out`` (what the device brought back)."""
    manifest = json.loads((cfg.out / MANIFEST).read_text())
    gpu = not manifest.get("dry", True)
    checks: list[Check] = []
    runs: dict[str, ModeRun] = {}
    for mode in cfg.modes:
        checks.append(check_capture(manifest, mode))
        archive = cfg.out / f"{mode}.tar.gz"
        if not archive.is_file():
            continue
        imported = import_mode(archive, cfg.out)
        checks.append(check_import(mode, imported.exports, imported.errors))
        if not imported.exports:
            continue
        try:
            runs[mode] = analyze_mode(imported.folder, imported.exports, imported.power)
        except (AnalysisError, OSError, KeyError, ValueError) as exc:
            checks.append(Check(mode, "analysis", FAIL, f"{type(exc).__name__}: {exc}"))
            continue
        checks += mode_checks(runs[mode], cfg, gpu)
    name = "graph time vs node kernel time"
    if not gpu:
        checks.append(Check("graph/node", name, SKIP, NEEDS_GPU))
    elif {"graph", "node"} <= set(runs):
        checks.append(check_graph_vs_node(runs["graph"], runs["node"], cfg))
    else:
        checks.append(Check("graph/node", name, FAIL, "needs both captures analyzed"))
    return checks, runs


def phase_summary(run: ModeRun) -> pl.DataFrame:
    """The driver's phases, median over steps: wall, GPU busy, kernel, graph time, energy.

    Without a GPU in the capture (the dry run) the GPU columns are empty ("—"), never 0.
    """
    rows = run.phases.filter(
        (pl.col("pid") == run.events["driver_pid"]) & (pl.col("attribution") == "window")
        & (pl.col("step") >= 1)
    )  # fmt: skip
    order = {p: i for i, p in enumerate(["step", *(f"step/{x}" for x in DRIVER_PHASES)])}
    return (
        rows.group_by("path")
        .agg(
            pl.len().alias("steps"),
            *(
                (pl.col(c).median() / 1e6).round(3).alias(c.replace("_ns", "_ms"))
                if c == "wall_ns" or run.devices
                else pl.lit(None, pl.Float64).alias(c.replace("_ns", "_ms"))
                for c in ("wall_ns", "gpu_busy_ns", "kernel_ns", "graph_ns")
            ),
            pl.col("energy_j").median().round(2),
        )
        .sort(pl.col("path").replace_strict(order, default=99, return_dtype=pl.Int64))
    )


def report_data(cfg: Config, checks: list[Check], runs: dict[str, ModeRun]) -> dict[str, Any]:
    """What ``gpu_capture.json`` holds."""
    return {
        "dry": cfg.dry,
        "dry_reason": cfg.dry_reason,
        "checks": [c.__dict__ for c in checks],
        "phases": {m: phase_summary(r).to_dicts() for m, r in runs.items()},
        "passed": all(c.status != FAIL for c in checks),
    }
