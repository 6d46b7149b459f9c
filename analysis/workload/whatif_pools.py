"""``balanced_pools``: the best split of an asynchronous run's GPUs between its two pools."""

from __future__ import annotations

import polars as pl

from .whatif_texts import ASSUMPTIONS, BALANCED_POOLS, BEST_SPLIT, NO_BUSY


def best_split(trainer_busy_s: float, rollout_busy_s: float, gpus: int) -> tuple[int, float]:
    """The trainer's GPUs of the best split of ``gpus`` between two pools, and its step time.

    The step time of a split ``g`` is ``max(trainer_busy_s / g, rollout_busy_s / (gpus − g))``;
    the best is the smallest over ``g = 1 … gpus − 1`` (the fewest trainer GPUs on a tie).
    """
    return min(
        ((g, max(trainer_busy_s / g, rollout_busy_s / (gpus - g))) for g in range(1, gpus)),
        key=lambda pair: (pair[1], pair[0]),
    )


def balanced_pool_bounds(
    steps: pl.DataFrame, pools: pl.DataFrame | None, missing: str | None
) -> pl.DataFrame | None:
    """``balanced_pools``: the step at the best split of the GPUs between pools (ASSUMPTIONS).

    ``steps``: ``step, step_s``; ``pools``: ``WhatIfInputs.pools``; ``missing``: why a run
    with pools has none. None for a run without pools; rows with a null bound (and the note
    why) where the pools' busy time is unknown.
    """
    rows: list[tuple[object, ...]] = []
    if pools is None:
        if missing is None:
            return None
        rows = [
            (step, step_s, None, missing, None)
            for step, step_s in steps.select("step", "step_s").rows()
        ]
        return _frame(rows)
    for step, step_s, trainer_s, n_t, rollout_s, n_r in (
        steps.join(pools, on="step", how="left")
        .select(
            "step", "step_s", "trainer_busy_s", "trainer_gpus", "rollout_busy_s", "rollout_gpus"
        )
        .rows()
    ):
        gpus = (n_t or 0) + (n_r or 0)
        if trainer_s is None or rollout_s is None or gpus < 2:
            rows.append((step, step_s, None, NO_BUSY, None))
            continue
        g, bound = best_split(trainer_s, rollout_s, gpus)
        text = (
            f"{ASSUMPTIONS[(BALANCED_POOLS, BEST_SPLIT)].rsplit(';', 1)[0]}; best split here: "
            f"trainer {g} + rollout {gpus - g} GPUs (measured {n_t} + {n_r})"
        )
        rows.append((step, step_s, bound, None, text))
    return _frame(rows)


def _frame(rows: list[tuple[object, ...]]) -> pl.DataFrame:
    """The rows as ``whatif_table`` takes a bound's (``_own_text``: the row's assumption)."""
    frame = pl.DataFrame(
        rows,
        schema={
            "step": pl.Int64,
            "measured_s": pl.Float64,
            "bound_s": pl.Float64,
            "note": pl.String,
            "_own_text": pl.String,
        },
        orient="row",
    )
    return frame.select(
        "step",
        pl.lit(BALANCED_POOLS).alias("bound"),
        pl.lit(BEST_SPLIT).alias("variant"),
        "measured_s",
        "bound_s",
        "note",
        "_own_text",
    )
