"""Shared names of the capture check: phases, roles, modes, files, and the options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: The driver's phases inside each ``step``, in order (VeRL's ``RayPPOTrainer.fit`` names).
DRIVER_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
#: Which worker does a driver phase's GPU work (none: the driver computes on its CPU), and the
#: range the worker marks around it (VeRL's worker method names).
PHASE_WORK: dict[str, tuple[tuple[str, str], ...]] = {
    "gen": (("rollout", "generate_sequences"),),
    "reward": (),
    "old_log_prob": (("trainer", "compute_log_prob"),),
    "ref": (("trainer", "compute_ref_log_prob"),),
    "adv": (),
    "update_actor": (("trainer", "update_actor"),),
    # both processes at once: the trainer packs its weights while the rollout loads new ones
    "update_weights": (("trainer", "weight_sync"), ("rollout", "weight_sync")),
}
ROLES = ("rollout", "trainer")
#: ``nsys profile --cuda-graph-trace`` values, one capture each.
MODES = ("graph", "node")
#: Written by the device step beside the captures (one per mode folder).
EVENTS_FILE = "events.json"  # the workers' CUDA-event (or CPU clock) timings and their pids
RANGES_FILE = "ranges.jsonl"  # the JSONL range recorder (every process, monotonic clock)
SAMPLES_FILE = "power_samples.json"  # the NVML sampler's samples (JSON: no polars there)
READS_FILE = "counter_reads.json"  # the driver's own energy-counter reads at phase ends
MANIFEST = "capture.json"  # what the device step ran and produced
#: Written by the import step.
POWER_PARQUET = "power.parquet"
REPORT_JSON = "gpu_capture.json"
REPORT_MD = "gpu_capture.md"
DRY_NOTICE = "DRY RUN on CPU (no GPU): GPU-only checks not run"
NEEDS_GPU = "not run: needs a GPU"
#: CUDA event timestamps have a resolution of about 0.5 µs (CUDA runtime documentation).
CUDA_EVENT_RESOLUTION_NS = 500


@dataclass
class Sizes:
    """Workload sizes: a few steps of GPU work, or a tiny CPU version."""

    steps: int = 3
    hidden: int = 4096  # rollout and trainer width
    batch: int = 1024  # rollout decode batch
    layers: int = 6  # rollout layers per decode step (one graph replay = one token)
    tokens: int = 48  # graph replays per gen
    micro_batches: int = 4  # trainer micro-batches per phase
    micro_batch: int = 2048  # rows per trainer micro-batch
    reward_s: float = 0.15  # driver CPU work in reward and adv (GPU idle)
    adv_s: float = 0.05

    @classmethod
    def dry(cls, steps: int = 2) -> Sizes:
        """CPU sizes: each phase a few ms."""
        return cls(
            steps=steps, hidden=64, batch=8, layers=2, tokens=6, micro_batches=2,
            micro_batch=16, reward_s=0.02, adv_s=0.01,
        )  # fmt: skip


@dataclass
class Config:
    """Options of one run of the check."""

    out: Path
    sizes: Sizes = field(default_factory=Sizes)
    dry: bool = False
    dry_reason: str = ""
    nsys: str = ""  # the nsys to capture with ("" = find one)
    modes: tuple[str, ...] = MODES
    interval_s: float = 0.02
    timeout_s: float = 240.0  # per capture
    #: events vs trace: each end of a span may differ by this (ns): event resolution + launch skew
    tol_events_ns: int = 20_000
    #: graph vs node: allowed relative difference beyond the measured replay overhead
    tol_graph: float = 0.05
    #: driver ranges: nsys vs the JSONL recorder, relative (or the absolute floor in ns)
    tol_wall: float = 0.01
    tol_wall_ns: int = 200_000
    tol_phase_energy: float = 0.05
