"""The synthetic GRPO run's timeline: warm-up, steps, worker ranges and their GPU operations.

One driver process marks ``step`` and the trainer phases; each worker rank (one GPU each, pid
``WORKER_PID0 + rank``) runs VeRL's worker range of each GPU phase: copies, a memset, compute
kernels (most decode kernels as CUDA graph executions with ``graphs``), NCCL collectives beside
them. Rank 0's generation straddles the end of ``gen``; rank r generates for
(1 - skew * r / ranks) of the longest time.
"""

from __future__ import annotations

import math

from nvtx_phases.power import COLUMNS as SAMPLER_COLUMNS

from .config import (
    DECODE_GRAPHS,
    FIRST_STEP_NS,
    GRPO_PHASES,
    WORKER_PID0,
    SynthConfig,
)
from .constants import (
    COMPUTE_KERNELS,
    COPY_KIND_D2D,
    COPY_KIND_P2P,
    MS,
    US,
    OpKind,
)
from .timeline import PhaseSpan, TailCopies, Timeline

#: Columns of the sampler's Parquet before it recorded GPU UUIDs; the default synthetic power
#: files keep this layout (an older sampler's file), so the bundled samples stay as they were.
LEGACY_SAMPLER_COLUMNS = tuple(c for c in SAMPLER_COLUMNS if c != "uuid")
#: The copy a worker range ends with before its D2H: gathered log-probs, broadcast weights.
_TAIL_COPIES: TailCopies = {
    "compute_log_prob": (2 << 20, COPY_KIND_D2D, 30 * US),
    "update_weights": (64 << 20, COPY_KIND_P2P, 60 * US),
}


class GrpoBuilder(Timeline):
    """The GRPO run on one clock: driver ranges, worker ranges, GPU operations, power."""

    def __init__(self, cfg: SynthConfig) -> None:
        super().__init__(cfg, cfg.seed)
        self.cfg = cfg

    def build(self) -> None:
        """Lay out the warm-up kernels and the steps."""
        cfg = self.cfg
        for r in range(cfg.ranks):  # warm-up before the first step, outside every range
            for i in range(cfg.warmup_kernels):
                s = 1 * MS + i * 200 * US
                self.op(
                    "kernel",
                    WORKER_PID0 + r,
                    r,
                    s,
                    s + 100 * US,
                    call_start=s - 20 * US,
                    name=COMPUTE_KERNELS[2],
                )
        self.lay_steps(FIRST_STEP_NS, cfg.steps, GRPO_PHASES)

    def phase(self, span: PhaseSpan) -> None:
        """Every rank runs the phase's worker range (none in a CPU-only phase)."""
        cfg = self.cfg
        worker = span.worker
        if span.name == "reward" and cfg.reward_model:
            worker = "compute_rm_score"
        if worker is None:
            return
        gen = span.name == "gen"
        for r in range(cfg.ranks):
            length = span.end - span.start - 300 * US
            if gen:
                length = int(length * (1 - cfg.length_skew * r / cfg.ranks))
            w_start = span.start + 100 * US
            straddle = None
            if gen and r == 0 and span.index + 1 < len(GRPO_PHASES):
                straddle = span.next_start + 300 * US  # into the next phase
            self.worker_phase(r, worker, w_start, w_start + length, span.step, straddle_to=straddle)

    def worker_phase(
        self, rank: int, name: str, w_start: int, w_end: int, step: int, *, straddle_to: int | None
    ) -> None:
        """Worker range ``name`` of ``rank`` over [w_start, w_end) and its GPU operations."""
        decode = self.cfg.graphs and name == "generate_sequences"  # decode steps as graphs

        def kernel_kind(i: int) -> tuple[OpKind, tuple[int, int]]:
            if decode and i >= 2 and i % 4 != 3:
                return "graph", DECODE_GRAPHS[i % 2]  # prefill and every 4th (sampling) stay eager
            return "kernel", (0, 0)

        self.trainer_range(
            WORKER_PID0 + rank,
            rank,
            name,
            w_start,
            w_end,
            step,
            kernels=self.cfg.kernels_per_phase,
            tail=_TAIL_COPIES,
            kernel_kind=kernel_kind,
            straddle_to=straddle_to,
            straddle_graph=DECODE_GRAPHS[0] if decode else None,
            gap_rounding=math.floor,
        )

    def power_samples(self) -> dict[str, list]:
        """NVML-sampler layout: per device and instant, power and an exact energy counter (mJ)."""
        t = self.sample_times()
        columns: dict[str, list] = {c: [] for c in LEGACY_SAMPLER_COLUMNS}  # an older sampler's
        for device in range(self.cfg.ranks):
            self.power.append_samples(columns, device, t, host="synthetic")
        return columns
