"""Analysis of one run (GPU samples or constructed ones): fills the report the gates then judge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from checks.gpu_check.edges import boundary_lags, counter_power, lag_summary
from checks.gpu_check.energy import phase_table, whole_run
from checks.gpu_check.gates import lag_tolerances
from checks.gpu_check.model import Config, Report
from checks.gpu_check.project import load_samples
from checks.gpu_check.reads import (
    alignment_summary,
    counter_period,
    read_alignment,
    reference_energy,
    reference_whole_run,
)
from checks.gpu_check.timeline import (
    interval_stats,
    map_to_sampler_clock,
    phase_windows,
    select_device,
    update_period_ms,
)


def analyze(
    report: Report, cfg: Config, ranges: pl.DataFrame, power_path: Path, device_uuid: str | None
) -> tuple[pl.DataFrame, str]:
    """Fill the report's clock, phases, whole run, boundaries, reference; (phase table, GPU)."""
    samples, device = select_device(load_samples([power_path]), device_uuid)
    mapped, report.clock = map_to_sampler_clock(ranges, samples)
    windows = phase_windows(mapped, device)
    t_int = samples["t_ns"].to_list()
    report.sample_interval = {
        **interval_stats(t_int, cfg.interval_s),
        "energy_counter_updates": update_period_ms(t_int, samples["energy_mj"].to_list()),
        "power_updates": update_period_ms(t_int, samples["power_w"].to_list()),
    }
    period = counter_period(report.sample_interval)
    table = phase_table(samples, windows)
    report.whole_run = whole_run(samples, windows)
    t = samples["t_ns"].cast(pl.Float64).to_list()
    series = {
        "counter": counter_power(t, samples["energy_mj"].to_list(), cfg.counter_span_ms * 1e6),
        "sampled": (t, samples["power_w"].to_list()),
    }
    report.boundaries = boundary_lags(windows, series, cfg.min_edge_w, cfg.edge_window_s * 1e9)
    report.lag_summary = {k: lag_summary(report.boundaries, k) for k in series}
    delay = _power_delay_ns(report.lag_summary)
    shifted = phase_table(samples, windows, shift_ns=delay) if delay else table
    report.phases = _phase_rows(table, shifted, delay)
    report.reference = {
        "counter_period_ms": period[0] / 1e6,
        "counter_period": period[1],
        "lag_tolerances_ms": list(lag_tolerances(cfg, period[0] / 1e6)),
    }
    if report.counter_reads:
        # the reads and the samples are stamped by one process with time.monotonic_ns()
        per_phase = reference_energy(
            table, samples, device, report.counter_reads, period[0], cfg.tol_phase
        )
        for row in report.phases:
            row.update(per_phase.get((row["step"], row["phase"]), {}))
        reads = read_alignment(samples, report.counter_reads)
        report.reference |= {
            "whole_run": reference_whole_run(
                report.whole_run, windows, samples, device, report.counter_reads, period[0]
            ),
            "alignment": alignment_summary(reads),
            "reads": reads,
        }
    return table, device


def _power_delay_ns(summary: dict[str, Any]) -> int:
    """Median lag of sampled power beyond the counter's (ns), 0 when either is unknown."""
    a, b = summary["sampled"]["median_ms"], summary["counter"]["median_ms"]
    return 0 if a is None or b is None else round((a - b) * 1e6)


def _phase_rows(table: pl.DataFrame, shifted: pl.DataFrame, delay_ns: int) -> list[dict[str, Any]]:
    """JSON rows of the phase table, with the integrated energy after undoing the power delay."""
    keep = [
        "step", "phase", "start_ns", "end_ns", "duration_s", "energy_integrated_j",
        "energy_counter_j", "rel_diff", "mean_power_counter_w", "mean_power_integrated_w",
        "mean_sampled_power_w", "n_samples",
    ]  # fmt: skip
    rows = table.select(keep).to_dicts()
    for row, s in zip(rows, shifted.to_dicts(), strict=True):
        row["rel_diff_power_shifted"] = s["rel_diff"]
        row["power_shift_ms"] = delay_ns / 1e6
    return rows
