"""Dry run: the analysis path on constructed samples and counter reads with known energy."""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import polars as pl

from checks.gpu_check.edges import edge_time
from checks.gpu_check.energy import counter_energy_between, window_energy
from checks.gpu_check.model import FAIL, PASS, PHASES, Check
from checks.gpu_check.project import PowerSampler, int_value

#: Power of each phase in the constructed samples of the dry run (W); outside phases: BASE_W.
SYNTH_LEVELS_W = {"idle": 100.0, "gen": 300.0, "update_actor": 500.0}
SYNTH_BASE_W = 50.0
SYNTH_GRID_NS = 1_000_000


def synthetic_exact_checks() -> list[Check]:
    """The analysis functions on constructed frames whose answers are exact numbers."""
    t = [i * 20_000_000 for i in range(101)]  # 0 … 2 s every 20 ms
    ramp = pl.DataFrame(
        {
            "device": ["g"] * len(t),
            "t_ns": t,
            "power_w": [100.0 + 100.0 * ti / 1e9 for ti in t],  # 100 → 300 W, linear
            "energy_mj": [250 * ti // 1_000_000 for ti in t],  # 250 W: 250 mJ per ms
        }
    )
    whole = pl.DataFrame({"id": [0], "device": ["g"], "start_ns": [0], "end_ns": [2_000_000_000]})
    integrated = float(window_energy(ramp, whole, "nvml-power")["energy_j"][0])  # ∫ = 400 J
    counter = counter_energy_between(ramp, "g", 505_000_000, 1_495_000_000)  # 0.99 s × 250 W
    step_t = [10_000_000 + i * 20_000_000 for i in range(100)]  # 10, 30, … ms
    edge = edge_time(
        ([float(v) for v in step_t], [100.0 if v < 1e9 else 300.0 for v in step_t]),
        200.0,
        True,
        0.0,
        2e9,
    )
    return [
        _exact("integrated energy of a 100→300 W ramp over 2 s", integrated, 400.0, "J"),
        _exact("counter energy at 250 W over [0.505, 1.495] s", counter, 247.5, "J"),
        _exact("edge of a 100→300 W step at 1 s (20 ms samples)", (edge or 0) / 1e6, 1000.0, "ms"),
    ]


def _exact(name: str, got: float, want: float, unit: str) -> Check:
    """A check that ``got`` equals ``want`` up to float rounding."""
    ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    return Check("synthetic", name, PASS if ok else FAIL, f"{got:.9g} {unit} (expected {want:g})")


def synthetic_samples(ranges: pl.DataFrame, path: Path) -> dict[tuple[int, str], float]:
    """Write sampler-layout Parquet for the recorded ranges with known power; expected joules.

    Power is SYNTH_LEVELS_W inside each (step, phase), SYNTH_BASE_W elsewhere; samples every
    SYNTH_GRID_NS plus at every phase boundary, so the counter (exact integral, in whole mJ)
    makes each phase's counter energy exactly level × duration (± the mJ rounding).
    """
    windows = ranges.filter(pl.col("path").is_in([f"step/{p}" for p in PHASES])).sort(
        "start_mono_ns"
    )
    spans = [
        (r["start_mono_ns"], r["end_mono_ns"], SYNTH_LEVELS_W[r["name"]])
        for r in windows.to_dicts()
    ]
    t0, t1 = int_value(ranges["start_mono_ns"].min()), int_value(ranges["end_mono_ns"].max())
    times = sorted(
        {
            *range(t0, t1 + SYNTH_GRID_NS, SYNTH_GRID_NS),
            *(s for s, _, _ in spans),
            *(e for _, e, _ in spans),
        }
    )

    def power_at(t: int) -> float:
        return next((w for s, e, w in spans if s <= t < e), SYNTH_BASE_W)

    energy, cum = [], 0.0
    for i, t in enumerate(times):
        cum += 0.0 if i == 0 else power_at(times[i - 1]) * (t - times[i - 1]) / 1e6  # mJ
        energy.append(round(cum))
    offset = time.time_ns() - time.monotonic_ns()
    n = len(times)
    sampler = PowerSampler()
    columns: dict[str, list[Any]] = {
        "host": [socket.gethostname()] * n, "pid": [os.getpid()] * n, "device": [0] * n,
        "uuid": ["GPU-00000000-0000-4000-8000-000000000001"] * n,
        "wall_ns": [t + offset for t in times], "mono_ns": times,
        "power_w": [power_at(t) for t in times], "energy_mj": energy,
        "sm_clock_mhz": [None] * n, "gpu_util_pct": [None] * n, "mem_util_pct": [None] * n,
    }  # fmt: skip
    for column, values in columns.items():
        sampler.samples[column].extend(values)
    sampler.write_parquet(path)
    return {
        (r["step"], r["name"]): SYNTH_LEVELS_W[r["name"]] * r["dur_ns"] / 1e9
        for r in windows.to_dicts()
    }


def synthetic_reads(ranges: pl.DataFrame, path: Path) -> list[dict[str, Any]]:
    """Workload-style counter reads at every phase's ends, from the constructed samples.

    The constructed counter has a sample at every boundary, so each read is its exact value.
    """
    samples = pl.read_parquet(path).select("mono_ns", "energy_mj")
    value = dict(zip(samples["mono_ns"].to_list(), samples["energy_mj"].to_list(), strict=True))
    windows = ranges.filter(pl.col("path").is_in([f"step/{p}" for p in PHASES]))
    return [
        {
            "step": r["step"], "phase": r["name"], "at": at, "mono_ns_before": t,
            "mono_ns_after": t, "energy_mj": value[t],
        }
        for r in windows.sort("start_mono_ns").to_dicts()
        for at, t in (("start", r["start_mono_ns"]), ("end", r["end_mono_ns"]))
    ]  # fmt: skip


def check_synthetic_counter(table: pl.DataFrame, expected: dict[tuple[int, str], float]) -> Check:
    """The pipeline's counter energy per phase equals the constructed energy (±2 mJ rounding)."""
    errors = [
        abs(r["energy_counter_j"] - expected[(r["step"], r["phase"])]) for r in table.to_dicts()
    ]
    ok = len(errors) == len(expected) and max(errors, default=1.0) <= 0.002
    return Check(
        "synthetic",
        "pipeline counter energy per phase = level × duration",
        PASS if ok else FAIL,
        f"{len(errors)} phases, max error {max(errors, default=float('nan')) * 1e3:.3f} mJ",
    )
