"""Command-line options → :class:`~checks.gpu_check.model.Config`, and dry or GPU mode."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from checks import gpu_check
from checks.gpu_check.environment import nvml_available
from checks.gpu_check.model import Config


def parse_args(argv: list[str] | None) -> Config:
    """Command line → Config (dry defaults: 0.1 s phases, 0.1 s warm-up, no tail)."""
    p = argparse.ArgumentParser(
        prog="python -m checks.gpu_check", description=(gpu_check.__doc__ or "").splitlines()[0]
    )
    p.add_argument("--out", required=True, type=Path, help="folder for the outputs")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--phase-s", type=float, help="seconds per phase (3.0; dry: 0.1)")
    p.add_argument(
        "--warmup-s", type=float, help="seconds of unmarked-phase warm-up (2.0; dry: 0.1)"
    )
    p.add_argument("--tail-s", type=float, help="unmarked idle after the last step (1.5; dry: 0)")
    p.add_argument("--interval-s", type=float, default=0.02, help="sampler interval (0.02)")
    p.add_argument("--dry", action="store_true", help="CPU only: no GPU, no NVML")
    p.add_argument(
        "--reanalyze",
        action="store_true",
        help="no run: analyze the files a GPU run left in --out again (new tolerances, fixes)",
    )
    p.add_argument(
        "--tol-phase",
        type=float,
        default=0.05,
        help="(a) per phase, pipeline vs workload counter reads: relative floor (0.05)",
    )
    p.add_argument(
        "--tol-ref-run",
        type=float,
        default=0.01,
        help="(a) whole run, pipeline vs workload counter reads (0.01)",
    )
    p.add_argument(
        "--tol-run", type=float, default=0.05, help="(a) whole run, integrated vs counter (0.05)"
    )
    p.add_argument(
        "--max-clock-ms",
        type=float,
        default=10.0,
        help="(a) a counter read outside the sampler's span for its value by at most this (10)",
    )
    p.add_argument(
        "--max-lag-ms", type=float, help="(c) each edge lag (default 2.5 counter update periods)"
    )
    p.add_argument(
        "--max-median-lag-ms",
        type=float,
        help="(c) |median| edge lag (default 1.5 counter update periods)",
    )
    p.add_argument(
        "--edge-window-s", type=float, default=1.0, help="(c) edge search ± this around (1.0)"
    )
    p.add_argument(
        "--min-edge-w", type=float, default=30.0, help="smallest level step to time (30 W)"
    )
    p.add_argument(
        "--counter-span-ms", type=float, default=100.0, help="counter-derivative span (100)"
    )
    p.add_argument(
        "--interval-median-max", type=float, default=1.5, help="median ≤ this × requested"
    )
    p.add_argument("--interval-p95-max", type=float, default=3.0, help="p95 ≤ this × requested")
    p.add_argument("--timeout-s", type=float, default=0.0, help="kill the run after this (0: auto)")
    a = p.parse_args(argv)
    cfg = Config(
        out=a.out, steps=a.steps, interval_s=a.interval_s, dry=a.dry, tol_phase=a.tol_phase,
        tol_ref_run=a.tol_ref_run, tol_run=a.tol_run, max_clock_ms=a.max_clock_ms,
        max_lag_ms=a.max_lag_ms, max_median_lag_ms=a.max_median_lag_ms,
        edge_window_s=a.edge_window_s, min_edge_w=a.min_edge_w,
        counter_span_ms=a.counter_span_ms, reanalyze=a.reanalyze, interval_median_max=a.interval_median_max,
        interval_p95_max=a.interval_p95_max, timeout_s=a.timeout_s,
    )  # fmt: skip
    cfg.phase_s = a.phase_s if a.phase_s is not None else (0.1 if a.dry else 3.0)
    cfg.warmup_s = a.warmup_s if a.warmup_s is not None else (0.1 if a.dry else 2.0)
    cfg.tail_s = a.tail_s if a.tail_s is not None else (0.0 if a.dry else 1.5)
    return cfg


def decide_mode(cfg: Config, torch: Any) -> None:
    """Fall back to dry (with the reason) without CUDA or NVML; shorten a dry run's phases."""
    if cfg.dry:
        cfg.dry_reason = "--dry"
        return
    if torch is None:
        cfg.dry_reason = "torch is not installed"
    elif not torch.cuda.is_available():
        cfg.dry_reason = "torch.cuda.is_available() is False"
    else:
        ok, why = nvml_available()
        cfg.dry_reason = "" if ok else why
    if cfg.dry_reason:
        cfg.dry = True
        cfg.phase_s, cfg.warmup_s = min(cfg.phase_s, 0.1), min(cfg.warmup_s, 0.1)
        cfg.tail_s = 0.0
