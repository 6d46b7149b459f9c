"""How close trace stage times come to logged ones, per stage: the scores both fidelity checks share."""

from __future__ import annotations

from typing import NamedTuple, cast

import polars as pl

MIN_SCORED_S = 0.001
"""Logged stage times below this (seconds) are reported but not scored in the overall accuracy."""


class StageAccuracy(NamedTuple):
    """What :func:`stage_accuracy` finds over the (step, stage) pairs compared."""

    #: per stage: n_steps, mean logged/trace seconds, mean (absolute) error %, accuracy_pct
    per_stage: pl.DataFrame
    #: the pairs logged for at least :data:`MIN_SCORED_S`
    scored: pl.DataFrame
    #: stages with no scored pair (their timer's own overhead dominates)
    unscored: list[str]
    #: 100 − the mean absolute error % over the scored pairs (None without any)
    overall_pct: float | None


def stage_accuracy(both: pl.DataFrame) -> StageAccuracy:
    """Per stage over the (step, stage) pairs ``both``: means, ``accuracy_pct``, what is scored.

    ``accuracy_pct`` is 100 − the mean absolute error %; only pairs logged for at least
    :data:`MIN_SCORED_S` are scored overall.
    """
    per_stage = (
        both.group_by("stage")
        .agg(
            pl.len().alias("n_steps"),
            pl.col("logged_s").mean().alias("mean_logged_s"),
            pl.col("trace_s").mean().alias("mean_trace_s"),
            pl.col("error_pct").mean().alias("mean_error_pct"),
            pl.col("error_pct").abs().mean().alias("mean_abs_error_pct"),
        )
        .with_columns((100 - pl.col("mean_abs_error_pct")).alias("accuracy_pct"))
        .sort("stage")
    )
    scored = both.filter(pl.col("logged_s") >= MIN_SCORED_S)
    unscored = sorted(set(both["stage"].to_list()) - set(scored["stage"].to_list()))
    overall = float(100 - cast(float, scored["error_pct"].abs().mean())) if scored.height else None
    return StageAccuracy(per_stage, scored, unscored, overall)
