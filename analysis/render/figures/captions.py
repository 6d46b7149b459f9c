"""One caption per figure: what it shows and how to read it (used under each figure in the report).

:data:`FIGURE_CAPTIONS` holds the figures of ``analyze``/``report`` and ``whatif``; a comparison's
``compare_<metric>`` figures get :func:`compare_caption` (it
depends on whether the runs have steps), which :func:`caption_for` returns for those stems too.
``nvtx-phases logs`` writes its own ``phase_share`` figure (a different one, from VeRL's
timers): its caption is :data:`VERL_LOGS_CAPTIONS`. Every figure's drawn numbers are in
``figures/<stem>.csv`` beside it.
"""

from __future__ import annotations

from ...aggregate.steps import STEP_METRICS

#: "Phases in execution order, each in its NVTX colour": said once, used in several captions
_ORDER = "Phases in execution order (first start), each in its NVTX colour"

#: steps left out of the per-step figures (see README: a range cut at the capture's end)
_CUT = (
    "A step whose step range, or a phase of it, nsys closed at the capture's end (its process "
    "exited before its last NVTX events were flushed) has no true wall time and is left out."
)
#: between a figure's stem and its GPU pool in file names (see ``figures.phases.for_pool``;
#: kept here too so that captions need no matplotlib)
POOL_STEM = "__pool-"

FIGURE_CAPTIONS: dict[str, str] = {
    "idle_by_cause": (
        "Idle GPU time of each GPU pool (GPU-seconds over all its GPUs), by what the pool was "
        "doing then: starvation (the trainer waiting for samples), refit (weight sync), partial "
        "rollout pause, generation limit (the rollouter paused at its staleness limit), "
        "validation, other phases, and no phase (inside none of the pool's ranges). Each "
        "instant of the pool's span counts for its innermost phase; the causes add up to the "
        "pool's idle time (idle_causes.csv has it per step)."
    ),
    "phase_time_per_step": (
        "Wall time of each phase per step, stacked bottom to top in execution order (the legend "
        "lists them top to bottom, as stacked), each phase in its NVTX colour; the grey 'other "
        "(no phase)' segment is the step's time no phase covers, so a bar is as tall as its "
        "step (where several processes mark a step, the mean per step range). Beyond 40 steps "
        "each bar is the mean step over a bin of consecutive steps, labelled first–last. " + _CUT
    ),
    "phase_share": (
        "Per phase, its share of the step: its wall time over the step range's (solid bars) "
        "and, when GPU power was measured, its GPU energy over the step's, energy between "
        "phases included (light, hatched bars); bar: median over steps (those where the phase "
        "ran), whiskers p10–p90. " + _ORDER + "; shares need not add up to 100%: the rest is "
        "time outside any phase. " + _CUT
    ),
    "busy_idle_per_phase": (
        "Per phase, GPU busy time (solid: a kernel or copy running) stacked under GPU idle time "
        "(light, hatched: the phase's wall time on a GPU with nothing running), each summed over "
        "all steps and all GPUs. " + _ORDER + "; a tall hatched part is a phase that holds its "
        "GPUs without using them."
    ),
    "data_movement_per_phase": (
        "Per phase, summed over all steps and GPUs: in the top panel NCCL kernel time (solid) "
        "beside memcpy time (light, hatched); in the bottom panel the data memcpy copied (in the "
        "unit on its axis). " + _ORDER + "; phases are categories, so no line joins them."
    ),
    "energy_per_phase_device": (
        "Energy of each phase on each GPU, summed over all steps: one bar per GPU (told apart by "
        "hatch, named by rank/GPU), or beyond 8 GPUs the median over GPUs with a p10–p90 "
        "whisker over GPUs. " + _ORDER + "."
    ),
    "power_timeline": (
        "GPU power over the whole run, one line per GPU (beyond 10 GPUs, the median over GPUs "
        "with a p10–p90 band). On long runs each line is the mean per driver phase or per bin "
        "of whole steps, and the light grey band spans the lowest to highest reading of all "
        "GPUs in each bin. The strip above shows the driver's phases in their NVTX colours, on "
        "the same time axis."
    ),
    "power_timeline_detail": (
        "GPU power within a few chosen steps (--detail-steps; by default the median-duration "
        "and the longest step), one panel per step, at the sampler's resolution, time from the "
        "step's start. The strip above each panel and the bands behind the lines are the "
        "driver's phases, in their NVTX colours."
    ),
    "power_envelope": (
        "Power per phase over all steps, phases in execution order. Top: per GPU, median power "
        "(dot), p95 (tick) and highest reading (triangle), joined by a line; beyond 8 GPUs, the "
        "median over GPUs of each, with a grey bar from the lowest median to the highest "
        "reading. Middle: per node (its GPUs summed), a median bar in the phase's NVTX colour "
        "(nodes told apart by hatch) with p95 tick, max triangle and the phase's share of the "
        "run's energy; bottom: how fast node power rises as the phase starts (W/ms: median "
        "bar, steepest diamond)."
    ),
    "length_cdf": (
        "Cumulative distribution of response lengths for a few steps (the first, the last and "
        "evenly between; one line each): the height at a length is the share of the step's "
        "responses at most that long. Log length axis; the dashed line is the length cap "
        "(--cap)."
    ),
    "length_heatmap": (
        "Response lengths over steps: each column is a step (beyond 100 steps, a group of "
        "consecutive steps, said in the title), each cell the share of that column's responses "
        "whose length falls in a log-spaced length bin (y; log colour bar on the right, so rare "
        "long responses show). The dashed line marks the length cap (--cap)."
    ),
    "straggler_timeline": (
        "Rollout stragglers over all steps. Top: each rank/GPU's idle tail per step, the time "
        "it waits after its own generation for the step's slowest rank to finish (white: the "
        "slowest rank; darker: a longer wait). Bottom: the generation time of the slowest and "
        "of the median rank per step (ms); the gap between them is the straggler cost."
    ),
    "whatif_per_step": (
        "Step time as measured (black) and under each what-if bound (one line per bound and "
        "variant; each an upper bound on the saving, from measured times; the assumptions are "
        "in whatif.md). Beyond 40 steps each point is the median over a bin of consecutive "
        "steps, without markers, with the p10–p90 band of the measured step time."
    ),
}

#: ``nvtx-phases logs``'s figure (from VeRL's timers, not a trace), by stem
VERL_LOGS_CAPTIONS: dict[str, str] = {
    "phase_share": (
        "Each phase's share of the step's logged time (VeRL's timing_s timers), stacked to "
        "100% per step, phases in execution order; the hatched grey 'other (not timed)' is the "
        "step's time no phase timer covers. Dots (right axis): step time in s; beyond 40 steps, "
        "bars pool bins of consecutive steps and the dots are the bin's median with p10–p90."
    ),
}

#: ``nvtx-phases study``'s figures (:mod:`analysis.render.figures.study`), by stem
STUDY_CAPTIONS: dict[str, str] = {
    "study_phase_signature": (
        "Phase signature: each of the step's direct phases' share of the step's time (left) and "
        "energy (right), one bar per run, runs grouped by the policy axis. Share: the median over steps "
        "of the phase's time (energy) / its step's × 100, as in every other share figure; "
        "phases that overlap or leave gaps make a bar differ from 100%. A run without power samples has "
        "no energy bar."
    ),
    "study_reward_cost": (
        "Reward-paradigm cost: the reward phase's median time, energy, data movement (memcpy "
        "volume) and power (its energy / wall time, all the run's GPUs together) over steps, one "
        "bar per run, coloured by the reward axis. For a reward computed on the CPU the power is "
        "what the GPUs draw while idle."
    ),
    "study_scaling": (
        "Scaling: median step time against the GPU count (left, one line per hardware), the "
        "step's energy per sample (middle: each run's median over steps of the step's energy, "
        "all its GPUs, / its sequences; needs power samples and token counts) and each phase's "
        "parallel efficiency (right): GPU time per sample T·n/S at the fewest GPUs of "
        "that hardware over that at n (S: sequences per step from the length records or VeRL's "
        "log; 1 = the GPUs added did proportionally more work, with the batch grown or not; below "
        "1 the phase gains less than the GPUs added). Without sample counts at some point, S is "
        "assumed equal (fixed batch: T(base)·n_base / (T(n)·n)) and the axis and "
        "study_scaling.csv (basis) say so. Where several runs share a point, their median."
    ),
    "study_token_energy": (
        "Energy per token: each run's energy over all steps / tokens over all steps, per direct "
        "phase and for the whole step (log scale, mJ). Generation counts response tokens; every "
        "other phase and the step count prompt + response tokens (VeRL's rule); energy is every "
        "sampled GPU's over the phase (tokens_energy.csv). A run without token counts or power "
        "has no bars."
    ),
    "study_lengths": (
        "Task → response-length structure: the empirical CDF of response lengths per task "
        "(left; all steps, validation rollouts left out) and, per run, the median over steps of "
        "the longest response / the mean (the straggler ratio) and of the DP ranks' token sums "
        "max / mean (load imbalance; 1 = balanced)."
    ),
}


def caption_for(stem: str) -> str:
    """The caption of the figure saved as ``stem`` (.png/.svg), or "" when it has none."""
    base, sep, pool = stem.partition(POOL_STEM)
    if sep and base in FIGURE_CAPTIONS:  # one GPU pool's copy of a figure (asynchronous RL)
        return (
            f"GPU pool {pool} only: its phase rows, on its own GPUs (where the pool's driver "
            "marks parameter versions, not steps, as the rollouter does, its steps are those "
            "versions). " + FIGURE_CAPTIONS[base]
        )
    if stem in FIGURE_CAPTIONS:
        return FIGURE_CAPTIONS[stem]
    if stem in STUDY_CAPTIONS:
        return STUDY_CAPTIONS[stem]
    metric = stem.removeprefix("compare_")
    if stem.startswith("compare_") and metric in STEP_METRICS:
        return compare_caption(metric)
    return ""


#: phases per panel of a ``compare_<metric>`` figure (the largest; compare.csv has them all)
MAX_PANEL_PHASES = 20


def compare_caption(metric: str, whole_capture: bool = False) -> str:
    """The caption of ``compare_<metric>``: what it shows and how to read it."""
    label, unit = STEP_METRICS[metric]
    spread = (
        "Each bar is the run's value over the whole capture (no step ranges: no spread)."
        if whole_capture
        else "Each bar is the run's median over steps; whiskers span p10–p90 over steps."
    )
    return (
        f"{label[:1].upper() + label[1:]} ({unit}) per phase, one bar per run, phases top to bottom in "
        f"execution order. {spread} Left: the driver's phases (window scheme: every GPU's work "
        "inside the phase), with the whole step on its own axis above; right: the workers' "
        f"ranges (projection scheme: the work they launched). At most {MAX_PANEL_PHASES} "
        "phases per panel (the largest); compare.csv has them all."
    )
