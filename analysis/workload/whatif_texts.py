"""The what-if bounds' names, row schema and assumptions, each spelled out once.

:mod:`analysis.workload.whatif` computes the bounds; ``whatif.csv``, ``whatif.md`` and the
report read the texts from here.
"""

from __future__ import annotations

import polars as pl

from .whatif_pipeline import OVERLAP_FORMULA

GEN = "gen"
OVERLAP, TAIL, BALANCED, TRANSITION, BALANCED_POOLS = (
    "overlap_gen_train",
    "no_straggler_tail",
    "balanced_dp",
    "no_transitions",
    "balanced_pools",
)
#: ``balanced_pools``' variant: the best split of the run's GPUs between its two pools
BEST_SPLIT = "best_split"
#: the rows of ``whatif.csv``: one per step × bound × variant
WHATIF_SCHEMA = {
    "step": pl.Int64,
    "bound": pl.String,
    "variant": pl.String,
    "measured_s": pl.Float64,
    "bound_s": pl.Float64,
    "saving_s": pl.Float64,
    "saving_pct": pl.Float64,
    "energy_saving_j": pl.Float64,
    "assumption": pl.String,
}
NO_BUSY = "no per-GPU busy time in this step"
NO_STEP_TIMER = (
    "no step timer logged for this step: its time is the sum of its stage timers, so the time "
    "between stages is not seen"
)
#: ``balanced_dp``'s step-level variant (its other variants are the step's phases)
WHOLE_STEP = "whole_step"
_REST = "rest = the step's wall − its gen (training, reward, weight sync, transitions)"
_NO_TAIL = (
    "everything after generation moves earlier by the removed tail; the stragglers' extra "
    "decoding is dropped or spread at no cost"
)
ASSUMPTIONS: dict[tuple[str, str], str] = {
    (OVERLAP, "separate_gpus"): (
        f"one-step-off async RL on separate GPUs, as a pipeline: {OVERLAP_FORMULA}; {_REST}; "
        "each side keeps its measured time on its own GPUs (splitting them slows neither; the "
        "extra GPUs' energy is not counted); the one-step policy lag not modelled"
    ),
    (OVERLAP, "shared_gpus"): (
        "one-step-off async RL on the same GPUs, time-sliced: as separate_gpus, each slot also "
        "at least the busiest GPU's busy time in both sides (rest of k, gen of k+1), so the "
        f"overlap only fills each side's idle GPU time; {_REST}; perfect time slicing, both "
        "fit in GPU memory"
    ),
    (TAIL, "p50_rank"): (
        "every rank's generation ends when the median rank's does (nearest rank: the "
        f"⌈n/2⌉-th end of n); {_NO_TAIL}"
    ),
    (TAIL, "p90_rank"): (
        "every rank's generation ends when the p90 rank's does (nearest rank: the ⌈0.9n⌉-th end "
        f"of n: with fewer than 10 ranks that is the last rank, and no saving); {_NO_TAIL}"
    ),
    (TAIL, "p90_response"): (
        "decoding stops when the p90 response finishes: responses decode in parallel at about "
        "the same rate, so it finishes at p90/max of the generation time (length records); "
        "the longest 10% of responses are dropped or spread at no cost"
    ),
    (BALANCED, WHOLE_STEP): "the step minus the balanced_dp saving of each of its phases",
    (BALANCED_POOLS, BEST_SPLIT): (
        "asynchronous RL on two GPU pools (trainer, rollout) as a steady pipeline: a step takes "
        "the slower pool's busy GPU time divided by its GPUs, at the best split of the run's "
        "GPUs between the pools (each pool ≥ 1 GPU); perfect scaling (a pool's busy GPU time "
        "divides evenly over its GPUs at the measured per-GPU rate: no extra communication, "
        "the model fits), idle time removed; the rollout pool's work per trainer step is its "
        "busy GPU time over the run / the trainer steps; the split of this row is in "
        "whatif.csv's assumption"
    ),
    (TRANSITION, "between_phases"): (
        "nothing runs between phases: the step's wall minus the sum of its direct child phases "
        "(disjoint: one thread's ranges nest, VeRL's stage timers run one after another) is removed; energy: the measured energy of that "
        "uncovered time (gap_energy_j of the step)"
    ),
}
#: ``balanced_dp``'s assumption for one phase (its variant is the phase's name)
BALANCED_PHASE = (
    "every GPU's busy time in this phase equal to the mean GPU's: the phase is shorter by the "
    "busiest GPU's busy time above the mean (wall − (max − mean)); its idle gaps and the "
    "phase's CPU time stay; NCCL waits count as busy, so imbalance hidden inside collectives "
    "is not seen"
)
#: how ``energy_saving_j`` is priced (every bound but ``no_transitions``)
ENERGY_RULE = (
    "energy_saving_j = saving_s × the idle power of the run's GPUs (summary idle_power_w, "
    "summed): the work is still done, only the waiting goes; null without power samples or "
    "an idle baseline"
)
