"""Energy columns joined onto a run's attribution, and the run's energy totals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from ..model import EnergyTotals
from .balance import energy_balance
from .phases import ENERGY_COLUMNS, phase_energy
from .samples import PowerData


@dataclass(frozen=True)
class WithEnergy:
    """Metrics per range and per (range, device) with energy columns, and the run's totals."""

    metrics: pl.DataFrame
    per_device: pl.DataFrame
    totals: EnergyTotals | None
    warnings: list[str]


def attach_energy(
    metrics: pl.DataFrame,
    per_device: pl.DataFrame,
    *,
    phases: pl.DataFrame,
    projection_devices: pl.DataFrame,
    blocks: pl.DataFrame,
    timeline: pl.DataFrame,
    power: PowerData | None,
    idle_power_w: float | None,
    window_devices: pl.DataFrame | None = None,
    pools: Sequence[tuple[pl.DataFrame, Sequence[str] | None]] | None = None,
) -> WithEnergy:
    """Join per-range and per-device energy onto ``metrics`` (null columns without power).

    ``timeline``: the ranges whose exclusive intervals partition the run for the energy
    balance (the window phases, or every phase when no driver marked any). In a run with GPU
    pools, ``window_devices`` (``rid, device``) names each window range's GPUs and ``pools`` each
    pool's timeline and GPUs (the balance is then per pool, summed).
    """
    if power is None or not power.samples.height:
        nulls = (pl.lit(None, dtype=dtype).alias(name) for name, dtype in ENERGY_COLUMNS.items())
        return WithEnergy(metrics.with_columns(nulls), per_device, None, [])
    energy = phase_energy(
        phases,
        projection_devices,
        blocks,
        power,
        idle_power_w=idle_power_w,
        window_devices=window_devices,
    )
    balance, balance_warnings = energy_balance(power, timeline, pools=pools)
    totals = EnergyTotals(
        **balance,
        power_source=power.source,
        power_interval_ns=power.interval_ns,
        power_alignment=power.alignment,
        idle_power_w=dict(energy.idle.iter_rows()),
    )
    warnings = [*energy.warnings, *balance_warnings]
    missing_idle = energy.idle.filter(pl.col("idle_power_w").is_null())["device"].to_list()
    if missing_idle:
        warnings.append(
            f"no idle baseline for GPU(s) {', '.join(missing_idle)} (too few idle samples); "
            "energy_above_idle_j is null: pass --idle-power-w"
        )
    short = phases.join(energy.per_range.filter(pl.col("below_sampling_interval")), on="rid").height
    if short:
        warnings.append(
            f"{short} phase range(s) are shorter than the power sampling interval "
            f"({(power.interval_ns or 0) / 1e6:.1f} ms): their energy is interpolated "
            "(below_sampling_interval)"
        )
    return WithEnergy(
        metrics.join(energy.per_range, on="rid", how="full", coalesce=True),
        per_device.join(energy.per_device, on=["rid", "device"], how="full", coalesce=True),
        totals,
        warnings,
    )
