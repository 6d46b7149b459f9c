"""Checks that run on any capture (CPU dry run included): capture, import, phases, processes, clocks.

Each compares the analysis' output (``nvtx_phases.analysis``) with what the run itself recorded,
independently of nsys: the workers' pids and replies (``events.json``) and the JSONL recorder's
ranges (``ranges.jsonl``, ``time.monotonic_ns()`` in every process).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from checks.gpu_capture.model import DRIVER_PHASES, PHASE_WORK, RANGES_FILE, Config
from checks.gpu_check.model import FAIL, PASS, Check

#: Ranges each worker marks per step (from the phase → work table).
WORKER_RANGES = {
    role: sorted(op for work in PHASE_WORK.values() for r, op in work if r == role)
    for role in ("rollout", "trainer")
}


def expected_driver_paths() -> list[str]:
    """``step`` and ``step/<phase>`` for every driver phase."""
    return ["step", *(f"step/{p}" for p in DRIVER_PHASES)]


def check_capture(manifest: dict[str, Any], mode: str) -> Check:
    """The device step's capture of ``mode``: ran to the end, streams of all three processes."""
    rows = [c for c in manifest.get("captures", []) if c["mode"] == mode]
    if not rows:
        return Check(mode, "capture", FAIL, manifest.get("error", "not captured"))
    c = rows[0]
    streams = {f.split(".")[0] for f in c["files"] if f.endswith((".qdstrm", ".nsys-rep"))}
    missing = sorted({"driver", "rollout", "trainer"} - streams)
    ok = c["exit_status"] == 0 and not c["timed_out"] and not missing
    detail = (
        f"exit {c['exit_status']}{' (timed out)' if c['timed_out'] else ''} after {c['seconds']} s"
        f"; streams {sorted(streams)}"
        + (f"; missing {missing}" if missing else "")
        + f"; packed {c['packed_bytes'] / 2**20:.1f} MiB"
        + (" (over the 16 MiB a device file may have)" if c["too_big_to_bring_back"] else "")
        + (f"; first try failed: {c['retried_after']}" if c.get("retried_after") else "")
    )
    return Check(mode, "capture", PASS if ok and not c["too_big_to_bring_back"] else FAIL, detail)


def check_import(mode: str, exports: list[Path], errors: list[str]) -> Check:
    """Every stream imported and exported to SQLite here."""
    names = sorted(p.stem for p in exports)
    ok = not errors and names == ["driver", "rollout", "trainer"]
    detail = f"SQLite exports: {names}" + (f"; errors: {'; '.join(errors)}" if errors else "")
    return Check(mode, "import and export", PASS if ok else FAIL, detail)


def read_recorder(folder: Path) -> pl.DataFrame:
    """The JSONL recorder's ranges of every process."""
    rows = [json.loads(x) for x in (folder / RANGES_FILE).read_text().splitlines() if x.strip()]
    return pl.DataFrame(rows).select("name", "path", "step", "pid", "start_mono_ns", "dur_ns")


def check_driver_phases(mode: str, ranges: pl.DataFrame, driver_pid: int, steps: int) -> Check:
    """The driver's ranges: ``step`` and each phase once per step 1…N, each inside its step."""
    mine = ranges.filter((pl.col("pid") == driver_pid) & pl.col("step").is_between(1, steps))
    got = sorted(mine.select("step", "path").rows())
    want = sorted((k, p) for k in range(1, steps + 1) for p in expected_driver_paths())
    steps_at = {r["step"]: r for r in mine.filter(pl.col("path") == "step").iter_rows(named=True)}
    outside = [
        f"{r['step']}:{r['path']}"
        for r in mine.iter_rows(named=True)
        if r["step"] in steps_at
        and not (
            steps_at[r["step"]]["start_ns"]
            <= r["start_ns"]
            <= r["end_ns"]
            <= steps_at[r["step"]]["end_ns"]
        )
    ]
    ok = got == want and not outside
    detail = (
        f"{len(got)} ranges (want {len(want)}: step > {', '.join(DRIVER_PHASES)} × {steps})"
        + (f"; differ: got {sorted(set(got) ^ set(want))[:6]}" if got != want else "")
        + (f"; not inside their step: {outside[:5]}" if outside else "; each inside its step")
    )
    return Check(mode, "driver phases and nesting", PASS if ok else FAIL, detail)


def check_workers(
    mode: str, ranges: pl.DataFrame, hellos: dict[str, Any], driver_pid: int, steps: int
) -> Check:
    """Both workers' ranges present (their pids), once per step, inside the driver's phase."""
    problems, counts = [], []
    drv = {
        (r["step"], r["name"]): r
        for r in ranges.filter(pl.col("pid") == driver_pid).iter_rows(named=True)
    }
    phase_of = {(role, op): name for name, work in PHASE_WORK.items() for role, op in work}
    for role, ops in WORKER_RANGES.items():
        pid = hellos.get(role, {}).get("pid")
        mine = ranges.filter((pl.col("pid") == pid) & pl.col("step").is_between(1, steps))
        got = sorted(mine.select("step", "name").rows())
        want = sorted((k, op) for k in range(1, steps + 1) for op in ops)
        counts.append(f"{role} pid {pid}: {len(got)} ranges")
        if got != want:
            problems.append(f"{role}: got {len(got)}, want {len(want)} ({', '.join(ops)} × N)")
        for r in mine.iter_rows(named=True):
            outer = drv.get((r["step"], phase_of.get((role, r["name"]), "")))
            if (
                outer is None
                or not outer["start_ns"] <= r["start_ns"] <= r["end_ns"] <= outer["end_ns"]
            ):
                problems.append(f"{role} step {r['step']} {r['name']} not inside the driver's")
    detail = "; ".join(counts) + (
        "; " + "; ".join(problems[:4]) if problems else "; each inside its driver phase"
    )
    return Check(mode, "both worker processes in the capture", FAIL if problems else PASS, detail)


def check_wall_times(
    mode: str, ranges: pl.DataFrame, recorder: pl.DataFrame, driver_pid: int, cfg: Config
) -> Check:
    """Driver ranges' wall time in the trace vs the JSONL recorder (the process's own clock)."""
    traced = ranges.filter(pl.col("pid") == driver_pid).select(
        "path", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("nsys_ns")
    )
    own = recorder.filter(pl.col("pid") == driver_pid).select("path", "step", "dur_ns")
    joined = traced.join(own, on=["path", "step"], how="inner").with_columns(
        (pl.col("nsys_ns") - pl.col("dur_ns")).abs().alias("diff_ns"),
        pl.max_horizontal(pl.col("dur_ns") * cfg.tol_wall, pl.lit(cfg.tol_wall_ns)).alias("tol"),
    )
    if joined.is_empty():
        return Check(mode, "driver wall time: nsys vs recorder", FAIL, "no range in both")
    over = joined.filter(pl.col("diff_ns") > pl.col("tol"))
    worst = joined.sort("diff_ns").row(-1, named=True)
    detail = (
        f"{joined.height - over.height}/{joined.height} driver ranges within "
        f"max({cfg.tol_wall:.0%}, {cfg.tol_wall_ns / 1e3:.0f} µs); worst {worst['path']} step "
        f"{worst['step']}: {worst['nsys_ns'] / 1e6:.3f} ms vs {worst['dur_ns'] / 1e6:.3f} ms"
    )
    return Check(mode, "driver wall time: nsys vs recorder", FAIL if over.height else PASS, detail)
