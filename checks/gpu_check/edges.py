"""Power edges vs phase boundaries: how late (or early) power changes where a phase changes."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import polars as pl

#: Consecutive phases closer than this share a boundary (their gap is the step range's close/open).
MAX_BOUNDARY_GAP_NS = 50_000_000
#: A counter edge is timed where the new level then holds for this many samples (one-sample
#: excursions of counter-derived power, from a counter update seen a sample late, are not edges).
EDGE_HOLD = 3


Series = tuple[list[float], list[float | None]]


def counter_power(t_ns: list[float], energy_mj: list[float | None], span_ns: float) -> Series:
    """Power from the energy counter: centered differences over about ``span_ns``.

    Each value is (E[i] − E[i−k]) / (t[i] − t[i−k]) in W at the midpoint of the two samples,
    ``k`` the number of sampling steps closest to ``span_ns`` (at least 1). A centered
    difference delays no edge, so its crossing times measure the clocks, not the averaging.
    """
    if len(t_ns) < 2:
        return [], []
    step_ns = statistics.median(b - a for a, b in itertools.pairwise(t_ns)) or 1.0
    k = max(1, round(span_ns / step_ns))
    times: list[float] = []
    power: list[float | None] = []
    for i in range(k, len(t_ns)):
        e0, e1, dt = energy_mj[i - k], energy_mj[i], t_ns[i] - t_ns[i - k]
        if e0 is None or e1 is None or dt <= 0:
            continue
        times.append((t_ns[i] + t_ns[i - k]) / 2)
        power.append((e1 - e0) * 1e6 / dt)  # mJ per ns → W
    return times, power


def level(series: Series, start_ns: float, end_ns: float) -> float | None:
    """Median power over the second half of [start, end] (clear of the edge that opened it)."""
    mid = (start_ns + end_ns) / 2
    inside = [p for t, p in zip(*series, strict=True) if mid <= t <= end_ns and p is not None]
    return statistics.median(inside) if inside else None


def edge_time(
    series: Series,
    half: float,
    rising: bool,
    t_from: float,
    t_to: float,
    near: float | None = None,
    hold: int = EDGE_HOLD,
) -> float | None:
    """When the power crosses ``half`` upward (or downward) in [t_from, t_to] and then holds.

    A crossing counts only if the sample after it and the ``hold`` − 1 after that all lie on the
    new side (a one- or two-sample excursion is not an edge). Of the crossings that count, the
    one closest to ``near``, or the first when ``near`` is None. Linear interpolation between the
    two samples around the crossing; None without one.
    """
    points = [(t, p) for t, p in zip(*series, strict=True) if p is not None]
    new_side = (lambda p: p >= half) if rising else (lambda p: p <= half)
    best: float | None = None
    for i in range(1, len(points)):
        (t0, p0), (t1, p1) = points[i - 1], points[i]
        if t0 < t_from:
            continue
        if t1 > t_to:
            break
        if not ((p0 < half <= p1) if rising else (p0 > half >= p1)):
            continue
        after = points[i : i + hold]
        if len(after) < hold or not all(new_side(p) for _, p in after):
            continue
        t = t0 + (half - p0) / (p1 - p0) * (t1 - t0)
        if near is None:
            return t
        if best is None or abs(t - near) < abs(best - near):
            best = t
    return best


def boundaries(windows: pl.DataFrame) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Consecutive phase windows that touch (across steps too): (before, after) pairs."""
    rows = windows.sort("start_ns").to_dicts()
    return [
        (a, b)
        for a, b in itertools.pairwise(rows)
        if b["start_ns"] - a["end_ns"] <= MAX_BOUNDARY_GAP_NS
    ]


def boundary_lag_ms(
    series: Series,
    before: dict[str, Any],
    after: dict[str, Any],
    min_edge_w: float,
    window_ns: float = 1e9,
    hold: int = EDGE_HOLD,
) -> float | None:
    """Power edge time − phase boundary time (ms) for one boundary, None when not measurable.

    The edge is a crossing of the midpoint between the two phases' levels (medians over each
    phase's second half) after which the new level holds for ``hold`` samples, searched within
    ``window_ns`` of the boundary (and no further than the middle of either phase); of several,
    the one closest to the boundary. Fluctuations inside a phase that cross the midpoint away
    from the boundary (counter-derived power in ``gen`` does) are not mistaken for its edge.
    """
    low = level(series, before["start_ns"], before["end_ns"])
    high = level(series, after["start_ns"], after["end_ns"])
    if low is None or high is None or abs(high - low) < min_edge_w:
        return None
    boundary = (before["end_ns"] + after["start_ns"]) / 2
    t_from = max((before["start_ns"] + before["end_ns"]) / 2, boundary - window_ns)
    t_to = min((after["start_ns"] + after["end_ns"]) / 2, boundary + window_ns)
    t = edge_time(series, (low + high) / 2, high > low, t_from, t_to, near=boundary, hold=hold)
    return None if t is None else (t - boundary) / 1e6


def boundary_lags(
    windows: pl.DataFrame,
    series: dict[str, Series],
    min_edge_w: float,
    window_ns: float = 1e9,
    hold: int = EDGE_HOLD,
) -> list[dict[str, Any]]:
    """One row per boundary: kind (``idle→gen``…), step, time, and the lag per power series."""
    origin = windows["start_ns"].min()
    rows = []
    for before, after in boundaries(windows):
        row: dict[str, Any] = {
            "step": after["step"],
            "boundary": f"{before['phase']}→{after['phase']}",
            "t_s": round((after["start_ns"] - origin) / 1e9, 4),
        }
        for name, s in series.items():
            lag = boundary_lag_ms(s, before, after, min_edge_w, window_ns, hold)
            row[f"lag_ms_{name}"] = None if lag is None else round(lag, 3)
        rows.append(row)
    return rows


def lag_summary(rows: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """Median and max |lag| (ms) of one series over the boundaries where it was measurable."""
    lags = [r[f"lag_ms_{source}"] for r in rows if r.get(f"lag_ms_{source}") is not None]
    return {
        "boundaries": len(rows),
        "measured": len(lags),
        "median_ms": round(statistics.median(lags), 3) if lags else None,
        "max_abs_ms": round(max(abs(v) for v in lags), 3) if lags else None,
    }
