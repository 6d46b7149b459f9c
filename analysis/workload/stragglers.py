"""Rollout stragglers from the trace: per rank, how long its GPU waits for the slowest rank.

Per step, each rank's generation range (VeRL's ``generate_sequences``, or nvtx_phases'
``generation``) ends at ``gen_end_ns``; the step's generation ends when the last rank's does.
``idle_tail_ns = last_end_ns − gen_end_ns`` is the time the rank's GPU waits with nothing to
decode. With power samples, ``idle_tail_energy_j`` is that GPU's energy over the tail. With
response lengths, ``tail_after_p90_ns`` estimates how long decoding ran after the p90 response
would have finished: sequences decode in parallel at about the same rate, so the p90 response
finishes at ``p90 / max`` of the generation time and the rest serves the longest 10% alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..energy.samples import PowerData, cumulative_energy, energy_at
from ..model import PROJECTION, Analysis
from .lengths import CapChoice, length_stats, resolve_cap, step_coverage
from .token_energy import energy_per_token
from .tokens import step_tokens_from_lengths

GENERATION_PHASES = ("generate_sequences", "generation")


def rank_devices(analysis: Analysis) -> pl.DataFrame:
    """The GPU each process ran most of its operations on: ``pid, device``."""
    ops = analysis.gpu_activity.lazy()
    if not {"pid", "device", "dur_ns"} <= set(ops.collect_schema().names()):
        return pl.DataFrame(schema={"pid": pl.Int64, "device": pl.String})
    return (
        ops.group_by("pid", "device")
        .agg(pl.col("dur_ns").sum())
        .sort("pid", "dur_ns", "device", descending=[False, True, False])
        .unique(subset="pid", keep="first", maintain_order=True)
        .select("pid", "device")
        .collect()
    )


def generation_tails(analysis: Analysis, lengths_stats: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step and rank: generation start/end, idle tail, busy share of gen, tail energy."""
    phases = analysis.phases.filter(
        pl.col("canonical").is_in(GENERATION_PHASES) & pl.col("step").is_not_null()
    )
    # one generation interval per rank and step (outermost if both names are marked)
    gen = (
        phases.sort("level")
        .unique(subset=["step", "pid"], keep="first", maintain_order=True)
        .select(
            "step",
            "pid",
            pl.col("start_ns").alias("gen_start_ns"),
            pl.col("end_ns").alias("gen_end_ns"),
        )
    )
    if gen.is_empty():
        return gen
    gen = gen.with_columns(
        pl.col("gen_end_ns").max().over("step").alias("last_end_ns")
    ).with_columns(
        (pl.col("last_end_ns") - pl.col("gen_end_ns")).alias("idle_tail_ns"),
        (pl.col("gen_end_ns") == pl.col("last_end_ns")).alias("is_straggler"),
    )
    gen = gen.join(rank_devices(analysis), on="pid", how="left")
    busy = analysis.phase_devices.filter(pl.col("path") == "step/gen").select(
        "step", "device", (pl.col("gpu_busy_ns") / pl.col("wall_ns")).alias("gen_busy_fraction")
    )
    gen = gen.join(busy, on=["step", "device"], how="left")
    samples = analysis.power_samples
    if samples is not None and samples.height:
        power = PowerData(
            samples=samples,
            source=analysis.summary.energy.power_source if analysis.summary.energy else "",
            interval_ns=None,
        )
        cum = cumulative_energy(power)
        start = energy_at(cum, gen.select("device", pl.col("gen_end_ns").alias("t_ns")))["cum_j"]
        end = energy_at(cum, gen.select("device", pl.col("last_end_ns").alias("t_ns")))["cum_j"]
        gen = gen.with_columns((end - start).alias("idle_tail_energy_j"))
    else:
        gen = gen.with_columns(pl.lit(None, dtype=pl.Float64).alias("idle_tail_energy_j"))
    if lengths_stats is not None:
        gen = (
            gen.join(lengths_stats.select("step", "p90", "max"), on="step", how="left")
            .with_columns(
                (
                    (pl.col("last_end_ns") - pl.col("gen_start_ns").min().over("step"))
                    * (1 - pl.col("p90") / pl.col("max"))
                )
                .round()
                .cast(pl.Int64)
                .alias("tail_after_p90_ns")
            )
            .drop("p90", "max")
        )
    return gen.sort("step", "pid")


def phase_imbalance(analysis: Analysis) -> pl.DataFrame:
    """Per step and projection phase: max/mean of the ranks' wall time (1 = balanced)."""
    rows = analysis.phases.filter(
        (pl.col("attribution") == PROJECTION) & pl.col("step").is_not_null()
    )
    return (
        rows.group_by("step", "canonical")
        .agg(
            pl.col("pid").n_unique().alias("ranks"),
            (pl.col("wall_ns").max() / pl.col("wall_ns").mean()).alias("wall_max_over_mean"),
            pl.col("wall_ns").max().alias("slowest_ns"),
        )
        .filter(pl.col("ranks") > 1)
        .sort("step", "canonical")
    )


@dataclass(frozen=True)
class RunLengths:
    """A run's response-length tables, computed once for ``lengths analyze --run`` and ``report``.

    ``stats``: :func:`~analysis.workload.lengths.length_stats` with ``cap`` (given or inferred);
    ``tails``: :func:`generation_tails`; ``energy``:
    :func:`~analysis.workload.token_energy.energy_per_token` (the tokens-and-energy table's
    ``gen`` and step rows, tokens from the records); ``warnings``: one
    line each where the records' steps and the run's do not match
    (:func:`~analysis.workload.lengths.step_coverage`).
    """

    stats: pl.DataFrame
    cap: CapChoice
    tails: pl.DataFrame
    energy: pl.DataFrame
    warnings: list[str]


def run_lengths(
    analysis: Analysis, responses: pl.DataFrame, cap: int | CapChoice | None = None
) -> RunLengths:
    """The length statistics of ``responses`` joined to ``analysis``'s steps (see RunLengths).

    ``cap``: the rollout's max response length, or None to infer it
    (:func:`~analysis.workload.lengths.resolve_cap`).
    """
    from ..run.select import available_steps

    choice = cap if isinstance(cap, CapChoice) else resolve_cap(responses, cap)
    stats = length_stats(responses, cap=choice)
    warnings = step_coverage(
        stats["step"].to_list(),
        available_steps(analysis),
        selected=analysis.summary.selection is not None,
    )
    return RunLengths(
        stats=stats,
        cap=choice,
        tails=generation_tails(analysis, stats),
        energy=energy_per_token(analysis, step_tokens_from_lengths(responses)),
        warnings=warnings,
    )
