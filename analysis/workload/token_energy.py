"""Tokens and energy per phase and step: J per token, tokens per J, inference vs training power.

:func:`tokens_energy` (``tokens_energy.csv``, the report's section, the Python API) joins the
driver's phases of each step (window ``step/X`` rows, and the ``step`` row) with the step's
tokens under the one rule of :mod:`analysis.workload.tokens` (``gen``: response tokens; every
other phase and the step: prompt + response). Energy is the phase table's ``energy_j`` of that
row (window scheme: every sampled GPU over the phase's interval, :mod:`analysis.energy.phases`).

Rows (``scope``):

- ``phase``: one per step and phase (in an asynchronous run, with GPU pools, the trainer's
  ``gen`` only takes finished samples from the rollouter's queue: no energy or kind for it); ``j_per_token = energy_j / tokens``,
  ``tokens_per_j = tokens / energy_j``, ``mean_power_w = energy_j / wall`` (phases.csv's
  ``avg_power_w``: the sampled GPUs together).
- ``kind``: per step, the inference-type and the training-type phases
  (:mod:`analysis.phase_kinds`) together: ``mean_power_w = Σ energy_j / Σ wall`` over them
  (one phase alone gives its ``avg_power_w``); null when a phase of the kind lacks energy.
- ``step``: the step row, with ``inference_over_training`` = the step's inference-type mean
  power ÷ its training-type mean power.
- the same with ``step`` empty: over all steps. A phase or the step: Σ energy ÷ Σ tokens over the
  steps where both are known (``n_steps`` of them); a kind: Σ energy ÷ Σ wall over the steps
  where the kind's energy is known, and the step row's ratio of those two.

Nothing is 0 for want of data: a value the inputs cannot support is null and ``note`` says why
(no power samples, a phase cut at the capture's end, no token count for the step, response
tokens the log cannot give, a phase marked by several processes).
"""

from __future__ import annotations

import polars as pl

from nvtx_phases.naming import STEP

from ..model import CUT, WINDOW, Analysis
from ..phase_kinds import INFERENCE, TRAINING, phase_kind
from ..phase_paths import is_step_phase
from .tokens import GENERATION, rule_tokens, token_rule

TOKENS_ENERGY_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "n_steps": pl.Int64(),
    "scope": pl.String(),
    "phase": pl.String(),
    "kind": pl.String(),
    "token_rule": pl.String(),
    "token_source": pl.String(),
    "tokens": pl.Int64(),
    "wall_ns": pl.Int64(),
    "energy_j": pl.Float64(),
    "j_per_token": pl.Float64(),
    "tokens_per_j": pl.Float64(),
    "mean_power_w": pl.Float64(),
    "inference_over_training": pl.Float64(),
    "note": pl.String(),
}
NO_POWER = "no power samples"
CUT_NOTE = "cut at the capture's end: its interval is not the phase's own"
NO_ENERGY = "no energy measured for this phase (see the warnings)"
NO_TOKENS = "no token count for this step"
QUEUED = (
    "asynchronous run: the trainer's gen takes finished samples from the rollouter's queue "
    "(they were generated on the rollout pool, on its version axis): not generation energy"
)


def _join_notes(*notes: pl.Expr) -> pl.Expr:
    """The non-null notes joined by ``; `` (null when there is none)."""
    text = pl.concat_str([n.fill_null("") for n in notes], separator="; ")
    text = text.str.replace_all(r"(; )+", "; ").str.strip_chars("; ")
    return pl.when(text == "").then(None).otherwise(text)


def _phase_rows(analysis: Analysis) -> pl.DataFrame:
    """One row per step and driver phase (and the step row): tokens, energy and their notes."""
    phases = analysis.phases
    rows = phases.filter(
        (pl.col("attribution") == WINDOW)
        & pl.col("step").is_not_null()
        & ((pl.col("path") == STEP) | is_step_phase())
    )
    grouped = rows.group_by("step", "path").agg(
        pl.col("canonical").first(),
        pl.len().alias("_marks"),
        pl.col("start_ns").min(),
        pl.col("wall_ns").first(),
        pl.col("energy_j").first(),
        pl.col(CUT).any().alias("_cut"),
    )
    several = pl.col("_marks") > 1
    # an asynchronous trainer's gen takes finished samples from the rollouter's queue
    queued = pl.lit(analysis.pools is not None) & (pl.col("path") == f"{STEP}/{GENERATION}")
    energy_note = (
        pl.when(pl.lit(analysis.summary.energy is None))
        .then(pl.lit(NO_POWER))
        .when(queued)
        .then(pl.lit(QUEUED))
        .when(several)
        .then(pl.format("marked by {} processes: no one interval's energy", pl.col("_marks")))
        .when(pl.col("_cut"))
        .then(pl.lit(CUT_NOTE))
        .when(pl.col("energy_j").is_null())
        .then(pl.lit(NO_ENERGY))
    )
    is_step = pl.col("path") == STEP
    tokens = analysis.step_tokens
    assert tokens is not None
    joined = grouped.join(tokens, on="step", how="left").with_columns(
        pl.when(is_step).then(pl.lit("step")).otherwise(pl.lit("phase")).alias("scope"),
        pl.when(is_step).then(pl.lit(STEP)).otherwise(pl.col("canonical")).alias("phase"),
        pl.when(is_step | queued).then(None).otherwise(phase_kind()).alias("kind"),
        token_rule(pl.when(is_step).then(pl.lit(STEP)).otherwise(pl.col("canonical"))).alias(
            "token_rule"
        ),
        pl.when(several).then(None).otherwise(pl.col("wall_ns")).alias("wall_ns"),
        pl.when(energy_note.is_null()).then(pl.col("energy_j")).alias("energy_j"),
        energy_note.alias("_energy_note"),
        pl.col("source").alias("token_source"),
    )
    token_note = (
        pl.when(pl.col("token_source").is_null())
        .then(pl.lit(NO_TOKENS))
        .when(pl.col("tokens").is_null())
        .then(pl.col("note"))
    )
    return (
        joined.with_columns(rule_tokens(pl.col("token_rule")).alias("tokens"))
        .with_columns(_join_notes(pl.col("_energy_note"), token_note).alias("note"))
        .with_columns(_ratios())
    )


def _ratios() -> list[pl.Expr]:
    energy, tokens = pl.col("energy_j"), pl.col("tokens")
    return [
        pl.when(tokens > 0).then(energy / tokens).alias("j_per_token"),
        pl.when(energy > 0).then(tokens / energy).alias("tokens_per_j"),
        (energy / (pl.col("wall_ns") / 1e9)).alias("mean_power_w"),
    ]


def _kind_rows(phase_rows: pl.DataFrame, no_power: bool) -> pl.DataFrame:
    """Per step and kind: Σ energy / Σ wall of the kind's phases, null if one lacks energy."""
    kinds = phase_rows.filter(pl.col("kind").is_not_null())
    complete = pl.col("energy_j").null_count() == 0
    lacking = pl.col("phase").filter(pl.col("energy_j").is_null()).unique(maintain_order=True)
    return (
        kinds.sort("start_ns")
        .group_by("step", "kind")
        .agg(
            pl.when(complete).then(pl.col("energy_j").sum()).alias("energy_j"),
            pl.when(complete).then(pl.col("wall_ns").sum()).alias("wall_ns"),
            pl.col("start_ns").min(),
            lacking.str.join(", ").alias("_lacking"),
        )
        .with_columns(
            pl.lit("kind").alias("scope"),
            pl.col("kind").alias("phase"),
            (pl.col("energy_j") / (pl.col("wall_ns") / 1e9)).alias("mean_power_w"),
            pl.when(pl.col("energy_j").is_null())
            .then(
                pl.lit(NO_POWER)
                if no_power
                else pl.format("no energy for {} (see its row)", pl.col("_lacking"))
            )
            .alias("note"),
        )
    )


def _power_ratio(kinds: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``inference_over_training`` per ``keys`` from the kind rows' mean power."""
    power = kinds.pivot(on="kind", index=keys, values="mean_power_w")
    for kind in (INFERENCE, TRAINING):
        if kind not in power.columns:
            power = power.with_columns(pl.lit(None, dtype=pl.Float64).alias(kind))
    return power.select(
        *keys, (pl.col(INFERENCE) / pl.col(TRAINING)).alias("inference_over_training")
    )


def _over_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """Phase and step rows over all steps: Σ energy ÷ Σ tokens where a step has both."""
    both = pl.col("energy_j").is_not_null() & pl.col("tokens").is_not_null()
    usable = pl.when(both.any()).then(both).otherwise(pl.col("tokens").is_not_null())
    picked = pl.col("step").filter(usable)
    first = pl.col("note").filter(~both).drop_nulls().first()
    return (
        rows.sort("step")
        .group_by("scope", "phase", maintain_order=True)
        .agg(
            pl.col("kind", "token_rule").first(),
            pl.col("token_source").drop_nulls().unique().sort().str.join(", "),
            pl.col("start_ns").min(),
            picked.len().cast(pl.Int64).alias("n_steps"),
            pl.col("tokens").filter(usable).sum().alias("tokens"),
            pl.col("wall_ns").filter(usable).sum().alias("wall_ns"),
            pl.when(both.any()).then(pl.col("energy_j").filter(both).sum()).alias("energy_j"),
            pl.when(both.any())
            .then(pl.col("step").filter(~both).cast(pl.String).str.join(", "))
            .alias("_left_out"),
            first.alias("_why"),
        )
        .with_columns(
            pl.when(pl.col("n_steps") == 0).then(None).otherwise(pl.col("tokens")).alias("tokens"),
            pl.when(pl.col("energy_j").is_null())
            .then(None)
            .otherwise(pl.col("wall_ns"))
            .alias("wall_ns"),
            pl.when(pl.col("energy_j").is_null())
            .then(pl.col("_why"))
            .when(pl.col("_left_out") != "")
            .then(pl.format("steps without both tokens and energy left out: {}", "_left_out"))
            .alias("note"),
        )
        .with_columns(_ratios())
    )


def _kinds_over_steps(kinds: pl.DataFrame, no_power: bool) -> pl.DataFrame:
    known = pl.col("energy_j").is_not_null()
    return (
        kinds.group_by("kind")
        .agg(
            pl.col("start_ns").min(),
            known.sum().cast(pl.Int64).alias("n_steps"),
            pl.when(known.any()).then(pl.col("energy_j").filter(known).sum()).alias("energy_j"),
            pl.when(known.any()).then(pl.col("wall_ns").filter(known).sum()).alias("wall_ns"),
        )
        .with_columns(
            pl.lit("kind").alias("scope"),
            pl.col("kind").alias("phase"),
            (pl.col("energy_j") / (pl.col("wall_ns") / 1e9)).alias("mean_power_w"),
            pl.when(pl.col("energy_j").is_null())
            .then(pl.lit(NO_POWER if no_power else "no step with energy for every phase of it"))
            .alias("note"),
        )
    )


_SCOPE_ORDER = {"phase": 0, "kind": 1, "step": 2}


def tokens_energy(analysis: Analysis) -> pl.DataFrame | None:
    """The tokens-and-energy table (see the module's docstring); None without token counts.

    Per step its phases in execution order, its two kinds, the step; then the same over all
    steps (``step`` null). Pure: reads ``analysis.phases``, ``step_tokens`` and the summary.
    """
    if analysis.step_tokens is None:
        return None
    no_power = analysis.summary.energy is None
    phases = _phase_rows(analysis)
    kinds = _kind_rows(phases, no_power)
    per_step = phases.join(_power_ratio(kinds, ["step"]), on="step", how="left").with_columns(
        pl.when(pl.col("scope") == "step").then(pl.col("inference_over_training")),
        pl.lit(1, pl.Int64).alias("n_steps"),
    )
    overall = _over_steps(phases)
    overall_kinds = _kinds_over_steps(kinds, no_power)
    ratio = _power_ratio(overall_kinds.with_columns(pl.lit(0).alias("_all")), ["_all"])
    overall = overall.with_columns(
        pl.when(pl.col("scope") == "step")
        .then(pl.lit(ratio["inference_over_training"][0] if ratio.height else None))
        .cast(pl.Float64)
        .alias("inference_over_training")
    )
    per_step_kinds = kinds.with_columns(pl.lit(1, pl.Int64).alias("n_steps"))
    whole = pl.concat(
        [
            _shaped(per_step),
            _shaped(per_step_kinds),
            _shaped(overall.with_columns(pl.lit(None, pl.Int64).alias("step"))),
            _shaped(overall_kinds.with_columns(pl.lit(None, pl.Int64).alias("step"))),
        ],
        how="vertical",
    )
    order = pl.col("scope").replace_strict(_SCOPE_ORDER, return_dtype=pl.Int64)
    kind_order = pl.col("kind").replace_strict({INFERENCE: 0, TRAINING: 1}, default=2)
    return whole.sort(
        pl.col("step").is_null(),
        "step",
        order,
        pl.when(pl.col("scope") == "kind").then(kind_order).otherwise(0),
        "_start",
        nulls_last=True,
    ).drop("_start")


def _shaped(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every column of :data:`TOKENS_ENERGY_SCHEMA` (null where it has none)."""
    columns = [
        pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype).alias(name)
        for name, dtype in TOKENS_ENERGY_SCHEMA.items()
    ]
    return frame.select(*columns, pl.col("start_ns").alias("_start"))


def energy_per_token(analysis: Analysis, step_tokens: pl.DataFrame) -> pl.DataFrame:
    """Per step of ``step_tokens``: ``gen``'s and the step's rows of :func:`tokens_energy`.

    ``tokens`` (response tokens), ``gen_energy_j``, ``gen_j_per_token``, ``tokens_per_gen_j``,
    ``step_tokens`` (prompt + response), ``step_energy_j``, ``step_j_per_token``: the rows of
    the one table, side by side (``lengths analyze --run``'s ``energy_per_token.csv``); steps of
    ``step_tokens`` that the run lacks keep their tokens, with null energy.
    """
    import dataclasses

    table = tokens_energy(dataclasses.replace(analysis, step_tokens=step_tokens))
    assert table is not None
    per_step = table.filter(pl.col("step").is_not_null())
    gen = per_step.filter((pl.col("scope") == "phase") & (pl.col("phase") == GENERATION)).select(
        "step",
        pl.col("energy_j").alias("gen_energy_j"),
        pl.col("j_per_token").alias("gen_j_per_token"),
        pl.col("tokens_per_j").alias("tokens_per_gen_j"),
    )
    step = per_step.filter(pl.col("scope") == "step").select(
        "step",
        pl.col("energy_j").alias("step_energy_j"),
        pl.col("j_per_token").alias("step_j_per_token"),
    )
    return (
        step_tokens.select(
            "step",
            pl.col("response_tokens").alias("tokens"),
            pl.col("total_tokens").alias("step_tokens"),
        )
        .join(gen, on="step", how="left")
        .join(step, on="step", how="left")
        .select(
            "step",
            "tokens",
            "gen_energy_j",
            "gen_j_per_token",
            "tokens_per_gen_j",
            "step_tokens",
            "step_energy_j",
            "step_j_per_token",
        )
        .sort("step")
    )
