"""DAPO's dynamic-sampling filter (PolyTrace's ``dapo_filter_indices.jsonl``) per trainer step.

One record per generation batch: ``workload_step, trainer_step, gen_batch_index, prompt_count,
n_sampling, train_batch_size, num_prompt_in_batch_before, kept_prompt_count, used_prompt_count,
kept_prompt_indices, used_prompt_indices``. DAPO generates batches of prompts, keeps the prompts
whose responses do not all score the same (the others carry no gradient), and generates again until
``train_batch_size`` kept prompts fill the trainer's batch; surplus kept prompts are dropped.

Per trainer step: ``generation_batches`` (records), ``prompts_generated`` (Σ ``prompt_count``),
``prompts_kept``, ``prompts_used`` (Σ of the counts), ``kept_of_generated_fraction`` = kept /
generated, ``used_of_generated_fraction`` = used / generated (the generated prompts the trainer
learns from), ``used_of_kept_fraction`` = used / kept, ``responses_generated`` = Σ
``prompt_count × n_sampling``, and ``batch_filled``: whether the used prompts reach
``train_batch_size`` (a log cut mid-step does not).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ..errors import WorkloadInputError
from .lengths import checked_records, typed_select

DAPO_GLOB = "dapo_filter_indices*.jsonl"
LAYOUT = "dapo_filter_indices"
REQUIRED = (
    "trainer_step",
    "prompt_count",
    "n_sampling",
    "train_batch_size",
    "kept_prompt_count",
    "used_prompt_count",
)


def read_dapo_filter(files: Sequence[Path]) -> pl.DataFrame:
    """One row per generation batch of ``dapo_filter_indices*.jsonl`` files.

    Columns: ``workload_step, gen_batch_index`` (null where absent), ``trainer_step,
    prompt_count, n_sampling, train_batch_size, kept_prompt_count, used_prompt_count``, and
    ``kept_prompt_listed, used_prompt_listed``: the lengths of the index lists (null where
    absent). A malformed or foreign file is a :class:`~analysis.errors.WorkloadInputError`.
    """
    frames = []
    for file, frame in checked_records(files, REQUIRED, LAYOUT):
        optional = {
            name: (pl.col(name) if name in frame.columns else pl.lit(None)).cast(pl.Int64)
            for name in ("workload_step", "gen_batch_index")
        }
        listed = {
            f"{name}_listed": (
                pl.col(f"{name}_indices").list.len()
                if f"{name}_indices" in frame.columns
                else pl.lit(None)
            ).cast(pl.Int64)
            for name in ("kept_prompt", "used_prompt")
        }
        typed = typed_select(
            file,
            frame,
            *(e.alias(n) for n, e in optional.items()),
            *(pl.col(c).cast(pl.Int64) for c in REQUIRED),
            *(e.alias(n) for n, e in listed.items()),
        )
        for name in REQUIRED:  # a null count would add up as 0: a wrong number
            if typed[name].null_count():
                raise WorkloadInputError(
                    f"{file}: {typed[name].null_count()} record(s) lack field {name} "
                    f"of the {LAYOUT} layout"
                )
        frames.append(typed)
    return pl.concat(frames)


def count_mismatches(batches: pl.DataFrame) -> list[str]:
    """Warnings where the records contradict themselves, one line each.

    A batch's index lists and its counts disagree (the counts are used), or a batch keeps more
    prompts than it generated or uses more than it kept.
    """
    lines = []
    over = batches.filter(
        (pl.col("kept_prompt_count") > pl.col("prompt_count"))
        | (pl.col("used_prompt_count") > pl.col("kept_prompt_count"))
    )
    if over.height:
        lines.append(
            f"dapo: {over.height} generation batch(es) keep more prompts than prompt_count or use "
            f"more than kept_prompt_count (trainer steps "
            f"{', '.join(map(str, over['trainer_step'].unique().sort()))}): inconsistent records"
        )
    for name in ("kept_prompt", "used_prompt"):
        listed = pl.col(f"{name}_listed")
        bad = batches.filter(listed.is_not_null() & (listed != pl.col(f"{name}_count")))
        if bad.height:
            lines.append(
                f"dapo: {bad.height} generation batch(es) list a different number of "
                f"{name}_indices than {name}_count (trainer steps "
                f"{', '.join(map(str, bad['trainer_step'].unique().sort()))}); the counts are used"
            )
    return lines


def dapo_steps(batches: pl.DataFrame) -> pl.DataFrame:
    """``dapo_steps.csv``: per trainer step, prompts generated, kept and used (module docstring)."""
    generated = pl.col("prompt_count").sum()
    return (
        batches.group_by("trainer_step")
        .agg(
            pl.len().cast(pl.Int64).alias("generation_batches"),
            pl.col("workload_step").min().alias("first_workload_step"),
            pl.col("workload_step").max().alias("last_workload_step"),
            generated.alias("prompts_generated"),
            pl.col("kept_prompt_count").sum().alias("prompts_kept"),
            pl.col("used_prompt_count").sum().alias("prompts_used"),
            (pl.col("prompt_count") * pl.col("n_sampling")).sum().alias("responses_generated"),
            pl.col("train_batch_size").max(),
        )
        .with_columns(
            _ratio("prompts_kept", "prompts_generated").alias("kept_of_generated_fraction"),
            _ratio("prompts_used", "prompts_generated").alias("used_of_generated_fraction"),
            _ratio("prompts_used", "prompts_kept").alias("used_of_kept_fraction"),
            (pl.col("prompts_used") >= pl.col("train_batch_size")).alias("batch_filled"),
        )
        .sort("trainer_step")
    )


def _ratio(part: str, whole: str) -> pl.Expr:
    """``part / whole``, null where ``whole`` is 0."""
    return pl.when(pl.col(whole) > 0).then(pl.col(part) / pl.col(whole)).otherwise(None)


def unfilled_notes(steps: pl.DataFrame) -> list[str]:
    """A note naming trainer steps whose used prompts fall short of the train batch."""
    short = steps.filter(~pl.col("batch_filled"))
    if short.is_empty():
        return []
    parts = [
        f"{r['trainer_step']} ({r['prompts_used']} of {r['train_batch_size']})"
        for r in short.iter_rows(named=True)
    ]
    return [
        f"dapo: trainer step(s) {', '.join(parts)} did not fill the train batch in these records "
        "(the log may end mid-step): batch_filled false"
    ]
