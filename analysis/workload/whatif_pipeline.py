"""The overlap what-if as a pipeline, and the steps that dominate a run's totals.

One-step-off async RL generates step k+1's responses while step k trains. Over n steps in order
(a ``--steps`` selection: its steps) the run then takes :data:`OVERLAP_FORMULA`: the first gen
runs alone (the pipeline's fill), the last step's rest alone (its drain). Dropping the fill
would hide a warm-up in step 1's gen (vLLM's first generation: compilation, CUDA graphs) and
count it as saved. A step many times longer than the others (:func:`dominant_steps`) dominates
every run total; ``whatif`` warns and names the ``--steps`` that leaves it out.
"""

from __future__ import annotations

import polars as pl

#: the overlap bound's run total and how it is split into per-step rows
OVERLAP_FORMULA = (
    "run = gen_1 + Σ_{k=1}^{n−1} max(gen_{k+1}, rest_k) + rest_n over the n steps in order: "
    "the first step's gen runs alone (pipeline fill), then the rest of step k runs beside the "
    "gen of step k+1, and the last step's rest runs alone (drain); step k's row is its slot "
    "max(gen_{k+1}, rest_k), the first step's with the fill gen_1 added, the last step's rest_n"
)
#: a step at least this many times the median of the other steps dominates the run's totals
DOMINANT_FACTOR = 3.0


def pipeline(steps: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (``step, step_s, gen_s``) in order, with the schedule's terms per step.

    Adds ``next_step`` and ``next_s`` (the next step and its gen; null for the last step),
    ``rest_s`` (``step_s − gen_s``), ``fill_s`` (the first step's gen, 0 for the others) and
    ``measured_s`` (``step_s``). Step k's slot is ``fill_s + max(next_s, rest_s)``, the last
    step's ``rest_s`` (no next gen): their sum is :data:`OVERLAP_FORMULA`.
    """
    return steps.sort("step").with_columns(
        pl.col("step").shift(-1).alias("next_step"),
        pl.col("gen_s").shift(-1).alias("next_s"),
        (pl.col("step_s") - pl.col("gen_s")).alias("rest_s"),
        pl.when(pl.int_range(pl.len()) == 0).then("gen_s").otherwise(0.0).alias("fill_s"),
        pl.col("step_s").alias("measured_s"),
    )


def slot_note(busy_note: str | None = None) -> pl.Expr:
    """Why a :func:`pipeline` row has no slot: a gen missing here or in the next step.

    ``busy_note``: also the reason when ``busiest_s`` is null (the shared-GPU variant).
    """
    note = (
        pl.when(pl.col("gen_s").is_null())
        .then(pl.lit("no gen phase in this step"))
        .when(pl.col("next_step").is_not_null() & pl.col("next_s").is_null())
        .then(pl.format("no gen phase in the next step ({})", "next_step"))
    )
    if busy_note is not None:
        note = note.when(pl.col("busiest_s").is_null()).then(pl.lit(busy_note))
    return note.otherwise(None)


def dominant_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps of ``steps`` (``step, step_s``) that dominate the run's totals.

    A step dominates when ``step_s ≥`` :data:`DOMINANT_FACTOR` × ``others_s``, the median of
    the other steps' times (so a warm-up step 1 of 2 is found too), and exceeds it. Columns
    ``step, step_s, others_s``; empty with fewer than 2 steps.
    """
    steps = steps.select("step", "step_s").drop_nulls().sort("step")
    n = steps.height
    if n < 2:
        return steps.with_columns(pl.lit(None, pl.Float64).alias("others_s")).clear()
    v = steps["step_s"].sort()
    rank = pl.col("step_s").rank("ordinal").cast(pl.Int64) - 1

    def other(j: int) -> pl.Expr:  # the j-th smallest of the others: skip this step's own place
        return pl.when(rank > j).then(pl.lit(v[j])).otherwise(pl.lit(v[j + 1]))

    others = (other((n - 2) // 2) + other((n - 1) // 2)) / 2  # the median of n − 1 values
    return steps.with_columns(others.alias("others_s")).filter(
        (pl.col("step_s") >= DOMINANT_FACTOR * pl.col("others_s"))
        & (pl.col("step_s") > pl.col("others_s"))
    )
