"""Shared names of the GPU check: phases, files, statuses, options, and the report's rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("idle", "gen", "update_actor")  # per step, in this order
ORDER = ("update_actor", "gen", "idle")  # expected mean power, highest first
RANGES_FILE = "ranges.jsonl"
POWER_FILE = "power.parquet"
SYNTH_POWER_FILE = "power_synthetic.parquet"
REPORT_FILE = "gpu_check.json"
DRY_NOTICE = "DRY RUN (no GPU): energy checks not run"
PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"
#: Counter update period assumed when the samples do not show one (H100/H200: 100 ms).
DEFAULT_COUNTER_PERIOD_MS = 100.0
NOT_RECORDED = (
    "not recorded in this run: its gpu_check.json has no workload counter reads (captured "
    "before the check took them); rerun on the GPU to evaluate"
)


@dataclass
class Config:
    """Options of one check run."""

    out: Path
    steps: int = 3
    phase_s: float = 3.0
    warmup_s: float = 2.0
    tail_s: float = 1.5
    interval_s: float = 0.02
    dry: bool = False
    reanalyze: bool = False
    dry_reason: str = ""
    #: (a) pipeline vs workload counter reads, per phase: relative floor of the tolerance
    tol_phase: float = 0.05
    #: (a) pipeline vs workload counter reads, whole run
    tol_ref_run: float = 0.01
    #: (a) integrated sampled power vs counter, whole run
    tol_run: float = 0.05
    #: (a) a workload counter read outside the sampler's window for its value by more than this
    max_clock_ms: float = 10.0
    #: (c) counter edge lag tolerances; None: ``lag_*_periods`` × the measured counter period
    max_lag_ms: float | None = None
    max_median_lag_ms: float | None = None
    lag_max_periods: float = 2.5
    lag_median_periods: float = 1.5
    #: (c) the edge is searched this far either side of the boundary
    edge_window_s: float = 1.0
    min_edge_w: float = 30.0
    counter_span_ms: float = 100.0
    interval_median_max: float = 1.5
    interval_p95_max: float = 3.0
    timeout_s: float = 0.0


@dataclass
class Check:
    """One row of the result table: PASS/FAIL gate the exit code, INFO/SKIP do not."""

    key: str
    name: str
    status: str
    detail: str


@dataclass
class Report:
    """Everything written to ``gpu_check.json``."""

    mode: str
    config: dict[str, Any]
    #: "captured" while only the run's files and facts are in (the JSON capture_gpu writes early)
    stage: str = "captured"
    environment: dict[str, Any] = field(default_factory=dict)
    clock: dict[str, Any] = field(default_factory=dict)
    power_reading: dict[str, Any] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)
    whole_run: dict[str, Any] = field(default_factory=dict)
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    lag_summary: dict[str, Any] = field(default_factory=dict)
    sample_interval: dict[str, Any] = field(default_factory=dict)
    #: The workload's own counter reads: step, phase, at (start/end), mono_ns_before/after, energy_mj
    counter_reads: list[dict[str, Any]] = field(default_factory=list)
    #: What the analysis made of them: whole run, per-read clock agreement, counter period used
    reference: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no check failed."""
        return all(c.status != FAIL for c in self.checks)
