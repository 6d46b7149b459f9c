"""The report's tokens-and-energy sections: views of ``tokens_energy.csv``, never a new number.

Per phase over all steps (J per token, tokens per J, mean power, kind), then per step (the
step's J per token, its inference-type and training-type mean power and their ratio). Every
value is a column of :func:`~analysis.workload.token_energy.tokens_energy`, renamed for the
report's units (``*_j_per_token`` reads in mJ/token).
"""

from __future__ import annotations

import polars as pl

from ...model import Analysis
from ...phase_kinds import INFERENCE, TRAINING
from ...workload.token_energy import tokens_energy
from .units import Section

PHASE_TITLE = "Tokens and energy per phase (all steps)"
STEP_TITLE = "Tokens, energy and inference vs training power per step"


def token_sections(analysis: Analysis) -> list[Section]:
    """The two sections (none without tokens per step, or when the run has no step rows)."""
    table = tokens_energy(analysis)
    if table is None or table.is_empty():
        return []
    return [(PHASE_TITLE, _phases(table)), (STEP_TITLE, _steps(table))]


def _phases(table: pl.DataFrame) -> pl.DataFrame:
    """Over all steps: each phase, the two kinds, the step."""
    return table.filter(pl.col("step").is_null()).select(
        "phase",
        "kind",
        "token_rule",
        "n_steps",
        "tokens",
        "energy_j",
        pl.col("j_per_token").alias("phase_j_per_token"),
        _rate("tokens_per_j"),
        "mean_power_w",
        pl.col("inference_over_training").round(3).alias("inference_over_training_power"),
        "note",
    )


def _steps(table: pl.DataFrame) -> pl.DataFrame:
    """One row per step: its tokens and energy, and its kinds' mean power side by side."""
    per_step = table.filter(pl.col("step").is_not_null())
    rows = per_step.filter(pl.col("scope") == "kind")
    kinds = (
        rows.pivot(on="kind", index="step", values="mean_power_w").rename(
            {INFERENCE: "inference_power_w", TRAINING: "training_power_w"}, strict=False
        )
        if rows.height
        else pl.DataFrame(schema={"step": pl.Int64})
    )
    for name in ("inference_power_w", "training_power_w"):
        if name not in kinds.columns:
            kinds = kinds.with_columns(pl.lit(None, dtype=pl.Float64).alias(name))
    return (
        per_step.filter(pl.col("scope") == "step")
        .join(kinds, on="step", how="left")
        .select(
            "step",
            "tokens",
            "energy_j",
            pl.col("j_per_token").alias("step_j_per_token"),
            _rate("tokens_per_j"),
            "inference_power_w",
            "training_power_w",
            pl.col("inference_over_training").round(3).alias("inference_over_training_power"),
            "note",
        )
    )


def _rate(name: str) -> pl.Expr:
    """Tokens per J as text, 4 significant digits (whole tokens from 1,000): never a wrong 0."""

    def text(value: float | None) -> str | None:
        if value is None:
            return None
        return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"

    return (
        pl.col(name)
        .map_elements(text, return_dtype=pl.String, skip_nulls=True)
        .alias("tokens_per_J")
    )
