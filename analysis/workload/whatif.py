"""What-if bounds per step: how much time (and energy) four changes could save at most.

Every bound is computed from measured phase times, one row per step, bound and variant
(:data:`WHATIF_SCHEMA`), each with its assumption beside it (:data:`ASSUMPTIONS`):

- ``overlap_gen_train``: one-step-off async RL, the generation of step k+1 running while the
  rest of step k trains, as a pipeline with its fill and drain (:data:`OVERLAP_FORMULA`); on
  separate GPUs, or on the same GPUs time-sliced;
- ``no_straggler_tail``: every rank's generation ending when the p50 (p90) rank's did, or
  decoding stopping when the p90 response finished (length records);
- ``balanced_dp``: per phase, every GPU as busy as the mean GPU;
- ``no_transitions``: the time inside a step that none of its phases covers, removed.

Inputs are :class:`WhatIfInputs`: the phase times (a run's driver/window phases, or a
``phase_times.csv`` from VeRL's logs, which carries times only) and, where measured, per-GPU
busy time, per-rank generation ends, length records and power. A bound without its data is a
row with a null ``bound_s`` whose assumption says ``not available: why``; nothing is invented.
A step with a range cut at the capture's end has no true time: the inputs leave it out, and
``WhatIfInputs.left_out`` says which and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nvtx_phases.naming import STEP

from .verl_logs import PHASE_TIMES_SCHEMA
from .whatif_pipeline import OVERLAP_FORMULA, pipeline, slot_note
from .whatif_pools import balanced_pool_bounds
from .whatif_texts import (
    ASSUMPTIONS,
    BALANCED,
    BALANCED_PHASE,
    GEN,
    NO_BUSY,
    NO_STEP_TIMER,
    OVERLAP,
    TAIL,
    TRANSITION,
    WHATIF_SCHEMA,
    WHOLE_STEP,
)

__all__ = ["OVERLAP_FORMULA", "PHASE_TIMES_SCHEMA", "WHATIF_SCHEMA"]  # re-exported


@dataclass(frozen=True)
class WhatIfInputs:
    """What the bounds are computed from; None where the run did not measure it."""

    #: ``step, phase, seconds``: each step's wall (phase ``step``) and its direct child phases
    times: pl.DataFrame
    #: ``step, phase, device, busy_s``: GPU busy time per device in each window phase
    busy: pl.DataFrame | None
    #: ``step, pid, gen_end_ns``: when each rank's generation range ended
    rank_ends: pl.DataFrame | None
    #: ``step, tail_s``: decoding after the p90 response would have finished
    p90_tail: pl.DataFrame | None
    #: ``step, gap_energy_j``: energy of the step outside its phases (measured)
    gap_energy: pl.DataFrame | None
    #: the idle power of all the run's GPUs together (W)
    idle_power_w: float | None
    #: where the phase times come from, in words
    source: str
    #: steps whose wall is the sum of their phases (a log without a step timer)
    summed_steps: tuple[int, ...] = ()
    #: one line per step left out of every bound, naming it and why (a range of it cut at the
    #: capture's end: no true time); those steps are in none of the frames above
    left_out: tuple[str, ...] = ()
    #: a run on two GPU pools: ``step, trainer_busy_s, trainer_gpus, rollout_busy_s,
    #: rollout_gpus`` (rollout busy per trainer step; null where not captured); None: no pools
    pools: pl.DataFrame | None = None
    #: why a run with pools has no ``pools`` frame (e.g. its rollout kernels not captured)
    pools_missing: str | None = None


# --- the bounds ----------------------------------------------------------------------------------


def p90_response_tail(times: pl.DataFrame, stats: pl.DataFrame) -> pl.DataFrame:
    """Per step: ``tail_s = gen × (1 − p90/max)``, from its gen time and length statistics."""
    return (
        times.filter(pl.col("phase") == GEN)
        .join(stats.select("step", "p90", "max"), on="step", how="inner")
        .select("step", (pl.col("seconds") * (1 - pl.col("p90") / pl.col("max"))).alias("tail_s"))
    )


def _steps(times: pl.DataFrame) -> pl.DataFrame:
    """Per step: ``step_s`` (its wall) and ``gen_s`` (its gen phase; null when not marked)."""
    gen = times.filter(pl.col("phase") == GEN).select("step", pl.col("seconds").alias("gen_s"))
    return (
        times.filter(pl.col("phase") == STEP)
        .select("step", pl.col("seconds").alias("step_s"))
        .join(gen, on="step", how="left")
        .sort("step")
    )


def _rows(frame: pl.DataFrame, bound: str, variant: str | pl.Expr, note: pl.Expr) -> pl.DataFrame:
    """``frame`` (step, measured_s, bound_s, …) as rows of ``bound``; ``note``: why not available."""
    label = pl.lit(variant) if isinstance(variant, str) else variant
    extra = ["energy_saving_j"] if "energy_saving_j" in frame.columns else []
    return frame.select(
        "step",
        pl.lit(bound).alias("bound"),
        label.alias("variant"),
        "measured_s",
        pl.when(note.is_null()).then(pl.col("bound_s")).alias("bound_s"),
        note.alias("note"),
        *extra,
    )


def _unavailable(steps: pl.DataFrame, bound: str, variant: str, why: str) -> pl.DataFrame:
    rows = steps.select(
        "step", pl.col("step_s").alias("measured_s"), pl.lit(None, pl.Float64).alias("bound_s")
    )
    return _rows(rows, bound, variant, pl.lit(why))


def overlap_bounds(inp: WhatIfInputs) -> pl.DataFrame:
    """``overlap_gen_train``: the steps as a pipeline, fill and drain included (see ASSUMPTIONS).

    Step k's row: ``fill_s + max(gen of the next step, rest of k)`` (separate GPUs; shared GPUs:
    also the busiest GPU's busy time in both); the last step has no next gen (drain: its rest).
    """
    if inp.pools is not None or inp.pools_missing is not None:
        steps = _steps(inp.times)
        why = "the run is already asynchronous, on separate GPU pools (see balanced_pools)"
        return pl.concat(
            [_unavailable(steps, OVERLAP, v, why) for v in ("separate_gpus", "shared_gpus")]
        )
    s = pipeline(_steps(inp.times))
    separate = s.with_columns(
        (pl.col("fill_s") + pl.max_horizontal("next_s", "rest_s")).alias("bound_s")
    )
    out = [_rows(separate, OVERLAP, "separate_gpus", slot_note())]
    if inp.busy is None:
        why = "needs per-GPU busy time (a trace or an analysis folder)"
        return pl.concat([*out, _unavailable(s, OVERLAP, "shared_gpus", why)])
    by_phase = {p: inp.busy.filter(pl.col("phase") == p).drop("phase") for p in (STEP, GEN)}
    busiest = (
        s.select("step", "next_step")
        .join(by_phase[STEP].rename({"busy_s": "step_busy"}), on="step")
        .join(by_phase[GEN].rename({"busy_s": "own_gen"}), on=["step", "device"], how="left")
        .join(
            by_phase[GEN].rename({"step": "next_step", "busy_s": "next_gen"}),
            on=["next_step", "device"],
            how="left",
        )
        .group_by("step")
        .agg(
            (pl.col("next_gen").fill_null(0) + pl.col("step_busy") - pl.col("own_gen").fill_null(0))
            .max()
            .alias("busiest_s")
        )
    )
    shared = s.join(busiest, on="step", how="left").with_columns(
        (pl.col("fill_s") + pl.max_horizontal("next_s", "rest_s", "busiest_s")).alias("bound_s")
    )
    out.append(_rows(shared, OVERLAP, "shared_gpus", slot_note(NO_BUSY)))
    return pl.concat(out, how="diagonal")


def tail_bounds(inp: WhatIfInputs) -> pl.DataFrame:
    """``no_straggler_tail``: generation ending at the p50/p90 rank's end, or the p90 response."""
    steps = _steps(inp.times)
    base = steps.select("step", pl.col("step_s").alias("measured_s"))
    out = []
    for variant, pct in (("p50_rank", 50), ("p90_rank", 90)):
        if inp.rank_ends is None:
            why = "no per-rank generation ranges (generate_sequences/generation) in this run"
            out.append(_unavailable(steps, TAIL, variant, why))
            continue
        ends = inp.rank_ends.group_by("step").agg(
            (
                pl.col("gen_end_ns").max()
                - pl.col("gen_end_ns").sort().get((pl.len().cast(pl.Int64) * pct + 99) // 100 - 1)
            ).alias("tail_ns")
        )
        rows = base.join(ends, on="step", how="left").select(
            "step", "measured_s", (pl.col("measured_s") - pl.col("tail_ns") / 1e9).alias("bound_s")
        )
        why = "no per-rank generation ranges in this step"
        out.append(
            _rows(rows, TAIL, variant, pl.when(pl.col("bound_s").is_null()).then(pl.lit(why)))
        )
    if inp.p90_tail is None:
        out.append(_unavailable(steps, TAIL, "p90_response", "no length records (--lengths)"))
    else:
        rows = base.join(inp.p90_tail, on="step", how="left").select(
            "step", "measured_s", (pl.col("measured_s") - pl.col("tail_s")).alias("bound_s")
        )
        why = "no length records or gen phase for this step"
        note = pl.when(pl.col("bound_s").is_null()).then(pl.lit(why))
        out.append(_rows(rows, TAIL, "p90_response", note))
    return pl.concat(out)


def balanced_bounds(inp: WhatIfInputs) -> pl.DataFrame:
    """``balanced_dp``: per phase, the busiest GPU's busy time above the mean GPU's removed."""
    steps = _steps(inp.times)
    if inp.busy is None:
        why = "needs per-GPU busy time (a trace or an analysis folder)"
        return _unavailable(steps, BALANCED, WHOLE_STEP, why)
    devices = inp.busy.filter(pl.col("phase") == STEP).select("step", "device")
    per_phase = (
        inp.times.filter(pl.col("phase") != STEP)
        .with_row_index("_order")
        .join(devices, on="step")  # every GPU of the step, a GPU without a row being idle
        .join(inp.busy, on=["step", "phase", "device"], how="left")
        .group_by("step", "phase", "seconds")
        .agg(
            pl.col("_order").first(),
            (pl.col("busy_s").fill_null(0).max() - pl.col("busy_s").fill_null(0).mean()).alias(
                "cut_s"
            ),
        )
        .sort("step", "_order")
    )
    phases = per_phase.select(
        "step",
        pl.col("seconds").alias("measured_s"),
        (pl.col("seconds") - pl.col("cut_s")).alias("bound_s"),
        pl.col("phase").alias("variant"),
    )
    whole = steps.join(per_phase.group_by("step").agg(pl.col("cut_s").sum()), on="step", how="left")
    whole = whole.select(
        "step",
        pl.col("step_s").alias("measured_s"),
        (pl.col("step_s") - pl.col("cut_s")).alias("bound_s"),
    )
    why = NO_BUSY
    return pl.concat(
        [
            _rows(phases, BALANCED, pl.col("variant"), pl.lit(None, pl.String)),
            _rows(
                whole, BALANCED, WHOLE_STEP, pl.when(pl.col("bound_s").is_null()).then(pl.lit(why))
            ),
        ]
    )


def transition_bounds(inp: WhatIfInputs) -> pl.DataFrame:
    """``no_transitions``: the step's time outside its direct child phases, removed."""
    covered = (
        inp.times.filter(pl.col("phase") != STEP)
        .group_by("step")
        .agg(pl.col("seconds").sum().alias("covered_s"))
    )
    rows = (
        _steps(inp.times)
        .join(covered, on="step", how="left")
        .select(
            "step",
            pl.col("step_s").alias("measured_s"),
            pl.min_horizontal("step_s", pl.col("covered_s").fill_null(0)).alias("bound_s"),
        )
    )
    if inp.gap_energy is not None:
        rows = rows.join(
            inp.gap_energy.rename({"gap_energy_j": "energy_saving_j"}), on="step", how="left"
        )
    unseen = pl.col("step").is_in(list(inp.summed_steps))
    return _rows(rows, TRANSITION, "between_phases", pl.when(unseen).then(pl.lit(NO_STEP_TIMER)))


def whatif_table(inp: WhatIfInputs) -> pl.DataFrame:
    """Every bound, one row per step × bound × variant (:data:`WHATIF_SCHEMA`)."""
    pooled = balanced_pool_bounds(_steps(inp.times), inp.pools, inp.pools_missing)
    rows = pl.concat(
        [
            overlap_bounds(inp),
            tail_bounds(inp),
            balanced_bounds(inp),
            transition_bounds(inp),
            *([pooled] if pooled is not None else []),
        ],
        how="diagonal",
    )
    if "energy_saving_j" not in rows.columns:
        rows = rows.with_columns(pl.lit(None, pl.Float64).alias("energy_saving_j"))
    texts = pl.DataFrame(
        [(b, v, t) for (b, v), t in ASSUMPTIONS.items()],
        schema=["bound", "variant", "_text"],
        orient="row",
    )
    # times to the ns (no float noise from sums taken in another order), then what follows
    rows = rows.join(texts, on=["bound", "variant"], how="left").with_columns(
        pl.col("measured_s", "bound_s").cast(pl.Float64).round(9)
    )
    saving = (pl.col("measured_s") - pl.col("bound_s")).round(9)
    return rows.select(
        pl.col("step").cast(pl.Int64),
        "bound",
        "variant",
        "measured_s",
        "bound_s",
        saving.alias("saving_s"),
        (saving * 100 / pl.col("measured_s")).alias("saving_pct"),
        pl.when(pl.col("bound_s").is_null())
        .then(None)
        .when(pl.col("bound") == TRANSITION)
        .then(pl.col("energy_saving_j"))
        .otherwise(saving * pl.lit(inp.idle_power_w, pl.Float64))
        .alias("energy_saving_j"),
        pl.when(pl.col("note").is_not_null())
        .then(pl.lit("not available: ") + pl.col("note"))
        .otherwise(_own_text(rows).fill_null(pl.col("_text")).fill_null(BALANCED_PHASE))
        .alias("assumption"),
    ).cast(WHATIF_SCHEMA)  # type: ignore[arg-type]


def _own_text(rows: pl.DataFrame) -> pl.Expr:
    """A row's own assumption (``balanced_pools`` names its split), where it has one."""
    return pl.col("_own_text") if "_own_text" in rows.columns else pl.lit(None, pl.String)


def run_level(table: pl.DataFrame) -> pl.DataFrame:
    """Per bound and variant over the run: steps, median saving per step, totals, assumption.

    ``steps`` counts the steps the bound is available for; the totals and ``run_saving_pct``
    (total saving / total measured time) are over those steps. ``energy_saving_j`` is null
    unless every such step has one.
    """
    ok = pl.col("bound_s").is_not_null()
    return (
        table.group_by("bound", "variant", maintain_order=True)
        .agg(
            ok.sum().cast(pl.Int64).alias("steps"),
            pl.col("saving_s").median().alias("median_saving_s"),
            pl.col("saving_pct").median().alias("median_saving_pct"),
            pl.col("measured_s").filter(ok).sum().alias("measured_s"),
            pl.col("saving_s").sum().alias("saving_s"),
            pl.when(pl.col("energy_saving_j").filter(ok).is_not_null().all() & ok.any())
            .then(pl.col("energy_saving_j").sum())
            .alias("energy_saving_j"),
            pl.col("assumption").sort_by(pl.col("bound_s").is_null()).first(),
        )
        .with_columns(
            pl.when(pl.col("steps") > 0)
            .then(pl.col("saving_s") * 100 / pl.col("measured_s"))
            .alias("run_saving_pct"),
            pl.when(pl.col("steps") > 0).then(pl.col("saving_s")).alias("saving_s"),
        )
    )
