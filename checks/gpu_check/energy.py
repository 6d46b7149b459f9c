"""Energy per phase by the project's analysis code: counter path and integrated sampled power."""

from __future__ import annotations

import statistics
from typing import Any

import polars as pl

from checks.gpu_check.project import (
    PowerData,
    cumulative_energy,
    energy_at,
    int_value,
    interval_energy,
)


def window_energy(samples: pl.DataFrame, windows: pl.DataFrame, source: str) -> pl.DataFrame:
    """The analysis code's energy per window: ``source`` "nvml-counter" or "nvml-power".

    "nvml-counter": the total-energy counter interpolated at the window's ends;
    "nvml-power": trapezoidal integration of the sampled power.
    """
    frame = samples.select("device", "t_ns", "power_w", "energy_mj")
    cum = cumulative_energy(PowerData(samples=frame, source=source, interval_ns=None))
    return interval_energy(cum, windows.select("id", "device", "start_ns", "end_ns"))


def counter_energy_between(samples: pl.DataFrame, device: str, a_ns: int, b_ns: int) -> float:
    """Joules the energy counter advanced over [a, b] (linear interpolation at both ends)."""
    frame = samples.select("device", "t_ns", "power_w", "energy_mj")
    cum = cumulative_energy(PowerData(samples=frame, source="nvml-counter", interval_ns=None))
    at = energy_at(cum, pl.DataFrame({"device": [device, device], "t_ns": [a_ns, b_ns]}))
    return float(at["cum_j"][1] - at["cum_j"][0])


def phase_table(samples: pl.DataFrame, windows: pl.DataFrame, shift_ns: int = 0) -> pl.DataFrame:
    """Per (step, phase): duration, integrated and counter energy, their difference, mean power.

    ``shift_ns``: move the power samples this much earlier before integrating (the counter
    energy is left alone), to see how much of a disagreement a delay explains.
    """
    counter = window_energy(samples, windows, "nvml-counter").select(
        "id", pl.col("energy_j").alias("energy_counter_j")
    )
    shifted = samples.with_columns(pl.col("t_ns") - shift_ns)
    integrated = window_energy(shifted, windows, "nvml-power").select(
        "id", pl.col("energy_j").alias("energy_integrated_j"), "n_samples"
    )
    mean_sampled = _mean_sampled_power(samples, windows)
    dur_s = (pl.col("end_ns") - pl.col("start_ns")) / 1e9
    return (
        windows.join(counter, on="id")
        .join(integrated, on="id")
        .join(mean_sampled, on="id", how="left")
        .with_columns(dur_s.alias("duration_s"))
        .with_columns(
            (
                (pl.col("energy_integrated_j") - pl.col("energy_counter_j"))
                / pl.col("energy_counter_j")
            ).alias("rel_diff"),
            (pl.col("energy_counter_j") / pl.col("duration_s")).alias("mean_power_counter_w"),
            (pl.col("energy_integrated_j") / pl.col("duration_s")).alias("mean_power_integrated_w"),
        )
        .sort("start_ns")
    )


def _mean_sampled_power(samples: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per window: the plain mean of the power samples taken inside it."""
    t = samples["t_ns"].to_list()
    p = samples["power_w"].to_list()
    rows = []
    for w in windows.iter_rows(named=True):
        inside = [
            v
            for tt, v in zip(t, p, strict=True)
            if w["start_ns"] <= tt <= w["end_ns"] and v is not None
        ]
        rows.append(
            {"id": w["id"], "mean_sampled_power_w": statistics.fmean(inside) if inside else None}
        )
    return pl.DataFrame(rows, schema={"id": pl.Int64, "mean_sampled_power_w": pl.Float64})


def whole_run(samples: pl.DataFrame, windows: pl.DataFrame) -> dict[str, Any]:
    """Integrated vs counter energy over [first phase start, last phase end]."""
    span = pl.DataFrame(
        {
            "id": [0],
            "device": [windows["device"][0]],
            "start_ns": [int_value(windows["start_ns"].min())],
            "end_ns": [int_value(windows["end_ns"].max())],
        }
    )
    counter = float(window_energy(samples, span, "nvml-counter")["energy_j"][0])
    integrated = float(window_energy(samples, span, "nvml-power")["energy_j"][0])
    return {
        "duration_s": (span["end_ns"][0] - span["start_ns"][0]) / 1e9,
        "energy_counter_j": counter,
        "energy_integrated_j": integrated,
        "rel_diff": (integrated - counter) / counter if counter else None,
    }
