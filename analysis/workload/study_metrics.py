"""The study's metric registry: every quantity of ``study.csv``, defined once.

Each :class:`StudyMetric` names its source (a loader of :data:`analysis.workload.study_sources.
SOURCES`), the column it reads and its scope: ``phase`` metrics are compared between the runs
having the phase; ``run`` metrics (records, logged memory) describe a run's whole workload and
sit on its ``step`` row. ``study_metrics.csv`` lists them. A new quantity is one entry here and,
for a new table, one loader there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..aggregate.steps import STEP_METRICS


@dataclass(frozen=True)
class StudyMetric:
    """One quantity of the tidy table: its name, unit, definition and where it comes from."""

    name: str
    unit: str
    definition: str
    source: str  #: the :data:`SOURCES` entry it is read from
    column: str
    scope: Literal["phase", "run"] = "phase"


def _median(
    name: str,
    unit: str,
    text: str,
    source: str,
    column: str,
    scope: Literal["phase", "run"] = "phase",
) -> StudyMetric:
    """A metric that is the median over steps of a per-step quantity."""
    return StudyMetric(name, unit, f"{text}, median over steps", source, column, scope)


_MB = 1_000_000
#: every metric of the tidy table, one entry each (``study_metrics.csv`` lists them)
STUDY_METRICS: tuple[StudyMetric, ...] = (
    *(_median(n, u, t, "phase_steps", n) for n, (t, u) in STEP_METRICS.items()),
    *(
        _median(
            f"{q}_share_pct", "%", f"the phase's {q} / its step's {q} × 100", "step_shares", f"{q}"
        )
        for q in ("time", "energy")
    ),
    StudyMetric(
        "j_per_token",
        "J/token",
        "Σ energy / Σ tokens over the steps where both are known (tokens_energy.csv; gen: "
        "response tokens, other phases and the step: prompt + response)",
        "tokens_energy",
        "j_per_token",
    ),
    StudyMetric(
        "tokens_per_j",
        "token/J",
        "Σ tokens / Σ energy over the steps (1 / j_per_token; tokens_energy.csv)",
        "tokens_energy",
        "tokens_per_j",
    ),
    StudyMetric(
        "inference_over_training_power",
        "ratio",
        "mean power of the inference-type phases / of the training-type phases, over all steps "
        "(tokens_energy.csv's inference_over_training; on the step row)",
        "power_ratio",
        "inference_over_training",
    ),
    _median(
        "energy_per_sample_j",
        "J",
        "the phase's energy in a step / the step's samples (sequences: responses)",
        "energy_per_sample",
        "energy_per_sample_j",
    ),
    _median("samples_per_step", "samples", "sequences (responses) per step", "samples", "n_seq"),
    StudyMetric(
        "peak_memory_mb",
        "MB",
        "the most device memory in use on any one GPU during the phase, over its steps "
        "(memory_per_phase.csv's peak_bytes / 1e6; its basis there)",
        "memory",
        "peak_mb",
    ),
    _median(
        "h2d_mb",
        "MB",
        "host-to-device copies starting in the phase, all GPUs (onload; memory_per_phase.csv)",
        "memory",
        "h2d_mb",
    ),
    _median(
        "d2h_mb",
        "MB",
        "device-to-host copies starting in the phase, all GPUs (offload; memory_per_phase.csv)",
        "memory",
        "d2h_mb",
    ),
    StudyMetric(
        "logged_max_allocated_gib",
        "GiB",
        "the highest perf/max_memory_allocated_gb VeRL logged over the steps (torch's peak, "
        "bytes / 1024³; null where logged as 0 without a GPU)",
        "logged_memory",
        "max_memory_allocated_gb",
        "run",
    ),
    StudyMetric(
        "logged_max_reserved_gib",
        "GiB",
        "the highest perf/max_memory_reserved_gb VeRL logged over the steps",
        "logged_memory",
        "max_memory_reserved_gb",
        "run",
    ),
    *(
        _median(name, unit, text, "lengths", column, scope="run")
        for name, unit, text, column in (
            ("response_max_over_mean", "ratio", "longest response / mean", "max_over_mean"),
            ("rank_imbalance", "ratio", "DP ranks' token sums, max / mean", "rank_imbalance"),
            ("response_mean_len", "tokens", "mean response length", "mean_len"),
        )
    ),
    *(
        _median(name, unit, text, "multiturn", column, scope="run")
        for name, unit, text, column in (
            ("turns_per_sample", "turns", "turns per sample (multiturn_steps.csv)", "turns_mean"),
            (
                "tool_latency_fraction",
                "fraction",
                "tool-call latency / (tool + engine latency), summed over samples",
                "tool_share_of_latency_fraction",
            ),
            (
                "prefix_cache_hit_fraction",
                "fraction",
                "cached prompt tokens / prompt tokens",
                "prefix_cache_hit_fraction",
            ),
            (
                "loss_masked_fraction",
                "fraction",
                "response tokens masked out of the loss (tool outputs) / response tokens",
                "loss_masked_fraction",
            ),
            (
                "slowest_decile_turns_over_p50",
                "ratio",
                "turns of the slowest 10% of samples / the median sample's",
                "slowest_decile_turns_over_p50",
            ),
        )
    ),
    *(
        _median(
            name,
            unit,
            f"{text} per trainer step whose batch is filled (dapo_steps.csv)",
            "dapo",
            c,
            scope="run",
        )
        for name, unit, text, c in (
            ("dapo_kept_fraction", "fraction", "prompts kept / generated", "kept_of_generated"),
            ("dapo_used_fraction", "fraction", "prompts used / generated", "used_of_generated"),
            ("dapo_generation_batches", "batches", "generation batches", "generation_batches"),
        )
    ),
)
