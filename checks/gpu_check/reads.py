"""The workload's own energy-counter reads: an independent reference for the pipeline's energy."""

from __future__ import annotations

from typing import Any

import polars as pl

from checks.gpu_check.model import DEFAULT_COUNTER_PERIOD_MS
from checks.gpu_check.project import PowerData, cumulative_energy, energy_at


def counter_period(sample_interval: dict[str, Any]) -> tuple[float, str]:
    """The energy counter's update period (ns) as measured in (e), and where it came from."""
    measured = sample_interval.get("energy_counter_updates", {}).get("median_change_ms")
    if measured:
        return measured * 1e6, f"{measured:.0f} ms, measured in (e)"
    return DEFAULT_COUNTER_PERIOD_MS * 1e6, f"{DEFAULT_COUNTER_PERIOD_MS:.0f} ms, assumed"


def _read_ns(read: dict[str, Any]) -> float:
    """When a read happened: the middle of the monotonic stamps around the NVML call."""
    return (read["mono_ns_before"] + read["mono_ns_after"]) / 2


def reads_by_phase(reads: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """``(step, phase)`` → ``{"start": read, "end": read}``, for reads that returned a value."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in reads:
        if r.get("energy_mj") is not None:
            out.setdefault((r["step"], r["phase"]), {})[r["at"]] = r
    return out


def _cum_counter(samples: pl.DataFrame) -> pl.DataFrame:
    """The pipeline's cumulative counter energy (``cum_j``) per sample."""
    frame = samples.select("device", "t_ns", "power_w", "energy_mj")
    return cumulative_energy(PowerData(samples=frame, source="nvml-counter", interval_ns=None))


def end_resolution_j(
    samples: pl.DataFrame, device: str, times_ns: list[float], period_ns: float
) -> list[float]:
    """Per time t: energy of one counter update period at the higher power around t (J).

    max(E[t − T, t], E[t, t + T]) from the pipeline's counter. A counter updated every T is read
    (by the sampler or by the workload) up to T stale, so two reads near t, of the same counter,
    can differ by one update: about T × the power around t, the higher side's at a boundary.
    """
    cum = _cum_counter(samples)
    queries = [v for t in times_ns for v in (t - period_ns, t, t + period_ns)]
    at = energy_at(
        cum, pl.DataFrame({"device": [device] * len(queries), "t_ns": [round(v) for v in queries]})
    )["cum_j"].to_list()
    return [max(at[i + 1] - at[i], at[i + 2] - at[i + 1]) for i in range(0, len(at), 3)]


def reference_energy(
    table: pl.DataFrame,
    samples: pl.DataFrame,
    device: str,
    reads: list[dict[str, Any]],
    period_ns: float,
    tol_phase: float,
) -> dict[tuple[int, str], dict[str, Any]]:
    """Per (step, phase) with both reads: the reads' energy, the pipeline's difference, the tol.

    The pipeline's energy is ``energy_counter_j`` of the phase table (sampler's counter samples,
    interpolated at the range's ends); the reference is end read − start read of the workload.
    Tolerance: max(``tol_phase`` × reference, resolution at the start + at the end).
    """
    by_phase = reads_by_phase(reads)
    rows = [
        r
        for r in table.select("step", "phase", "start_ns", "end_ns", "energy_counter_j").to_dicts()
        if {"start", "end"} <= set(by_phase.get((r["step"], r["phase"]), {}))
    ]
    ends = [t for r in rows for t in (r["start_ns"], r["end_ns"])]
    resolution = end_resolution_j(samples, device, ends, period_ns) if rows else []
    out = {}
    for i, r in enumerate(rows):
        pair = by_phase[(r["step"], r["phase"])]
        ref = (pair["end"]["energy_mj"] - pair["start"]["energy_mj"]) / 1000.0
        tol = max(tol_phase * abs(ref), resolution[2 * i] + resolution[2 * i + 1])
        out[(r["step"], r["phase"])] = {
            "energy_reads_j": ref,
            "rel_diff_reads": (r["energy_counter_j"] - ref) / ref if ref else None,
            "diff_reads_j": r["energy_counter_j"] - ref,
            "tol_reads_j": tol,
            "reads_offset_ms": max(
                abs(_read_ns(pair["start"]) - r["start_ns"]),
                abs(_read_ns(pair["end"]) - r["end_ns"]),
            )
            / 1e6,
        }
    return out


def reference_whole_run(
    run: dict[str, Any],
    windows: pl.DataFrame,
    samples: pl.DataFrame,
    device: str,
    reads: list[dict[str, Any]],
    period_ns: float,
) -> dict[str, Any]:
    """Pipeline counter energy over the whole run vs the first phase's start read → last's end."""
    by_phase = reads_by_phase(reads)
    ordered = windows.sort("start_ns").to_dicts()
    if not ordered:
        return {}
    first = by_phase.get((ordered[0]["step"], ordered[0]["phase"]), {}).get("start")
    last = by_phase.get((ordered[-1]["step"], ordered[-1]["phase"]), {}).get("end")
    if first is None or last is None:
        return {}
    ref = (last["energy_mj"] - first["energy_mj"]) / 1000.0
    res = end_resolution_j(
        samples, device, [ordered[0]["start_ns"], ordered[-1]["end_ns"]], period_ns
    )
    pipeline = run["energy_counter_j"]
    return {
        "energy_counter_j": pipeline,
        "energy_reads_j": ref,
        "rel_diff": (pipeline - ref) / ref if ref else None,
        "resolution_j": sum(res),
    }


def read_alignment(samples: pl.DataFrame, reads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload read: whether its time falls where the sampler saw the counter hold its value.

    The sampler saw the counter below the read's value last at ``a`` and above it first at ``c``
    (its own stamps); on one clock the read must lie in (a, c). ``offset_ms``: 0 inside, else
    how far outside (negative: before ``a``, positive: after ``c``); None when the samples do not
    bracket the value. ``window_ms``: (a, c) relative to the read, the clock shifts it allows.
    """
    t = samples["t_ns"].to_list()
    e = samples["energy_mj"].to_list()
    known = [(tt, ee) for tt, ee in zip(t, e, strict=True) if ee is not None]
    rows = []
    for r in reads:
        value = r.get("energy_mj")
        row = {k: r[k] for k in ("step", "phase", "at", "energy_mj")}
        row["read_ms"] = round((r["mono_ns_after"] - r["mono_ns_before"]) / 1e6, 3)
        below = [tt for tt, ee in known if value is not None and ee < value]
        above = [tt for tt, ee in known if value is not None and ee > value]
        if not below or not above:
            rows.append({**row, "offset_ms": None, "window_ms": None})
            continue
        a, c = max(below), min(above)
        lo, hi = r["mono_ns_before"], r["mono_ns_after"]
        offset = (hi - a) if hi <= a else (lo - c) if lo >= c else 0
        mid = _read_ns(r)
        rows.append(
            {
                **row,
                "offset_ms": round(offset / 1e6, 3),
                "window_ms": [round((a - mid) / 1e6, 3), round((c - mid) / 1e6, 3)],
            }
        )
    return rows


def alignment_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst offset, and the sampler − workload clock shift every read allows (ms)."""
    measured = [r for r in rows if r.get("offset_ms") is not None]
    if not measured:
        return {"reads": len(rows), "measured": 0}
    lo = max(r["window_ms"][0] for r in measured)
    hi = min(r["window_ms"][1] for r in measured)
    return {
        "reads": len(rows),
        "measured": len(measured),
        "max_abs_offset_ms": max(abs(r["offset_ms"]) for r in measured),
        "outside": sum(r["offset_ms"] != 0 for r in measured),
        "allowed_shift_ms": [lo, hi] if lo < hi else None,
        "max_read_ms": max(r["read_ms"] for r in measured),
    }
