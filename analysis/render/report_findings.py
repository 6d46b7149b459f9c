"""The report's "what stands out": four sentences computed from its tables.

Each finding is a sentence with its numbers, or, when the data for it is missing (no power
samples, no GPU work, one rank), says so and why. The phases compared are those directly inside
``step`` (window scheme); a run without step ranges uses its top-level phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analysis.model import WINDOW, Analysis


@dataclass(frozen=True)
class Finding:
    """One line of "what stands out": ``text``, or why it is left out (``omitted``)."""

    topic: str
    text: str
    omitted: bool = False


def _ms(value: float) -> str:
    return f"{value / 1e3:,.2f} s" if value >= 10_000 else f"{value:,.2f} ms"


def _range(low: float, high: float) -> str:
    """``23.64–25.29 ms`` (one unit for both ends)."""
    if max(low, high) >= 10_000:
        return f"{low / 1e3:,.2f}–{high / 1e3:,.2f} s"
    return f"{low:,.2f}–{high:,.2f} ms"


#: the idlest phase is looked for among phases of at least this share of the step's time
IDLE_MIN_SHARE = 0.02


def top_phases(summary: pl.DataFrame) -> tuple[pl.DataFrame, dict | None]:
    """The phases directly inside ``step`` (else top-level phases) and the ``step`` row."""
    window = summary.filter(pl.col("attribution") == WINDOW)
    step = window.filter(pl.col("path") == "step")
    inside = window.filter(
        pl.col("path").str.starts_with("step/") & (pl.col("path").str.count_matches("/") == 1)
    )
    if inside.is_empty():
        inside = summary.filter(~pl.col("path").str.contains("/") & (pl.col("path") != "step"))
    return inside, (step.row(0, named=True) if step.height else None)


def largest_phase(inside: pl.DataFrame, step: dict | None) -> Finding:
    """The phase with the largest median wall time."""
    rows = inside.filter(pl.col("wall_ms").is_not_null())
    if rows.is_empty():
        return Finding("largest phase", "no phase with a duration", omitted=True)
    top = rows.sort(["wall_ms", "path"], descending=[True, False]).row(0, named=True)
    if top["n_steps"] is None:  # no step ranges
        text = f"{top['path']} takes the most time: {_ms(top['wall_ms'])} over the whole capture"
    else:
        text = (
            f"{top['path']} takes the most time: {_ms(top['wall_ms'])} per step "
            f"(median; p10–p90 {_range(top['wall_ms_p10'], top['wall_ms_p90'])})"
        )
    if step is not None and step["wall_ms"]:
        text += (
            f", {100 * top['wall_ms'] / step['wall_ms']:.0f}% of the step's {_ms(step['wall_ms'])}"
        )
    return Finding("largest phase", text + ".")


def idlest_phase(inside: pl.DataFrame, step: dict | None) -> Finding:
    """The phase with the lowest GPU busy share (ties: the longer phase).

    Phases shorter than :data:`IDLE_MIN_SHARE` of the step are passed over (a 1 ms phase at 0%
    says little) unless every phase is that short.
    """
    rows = inside.filter(pl.col("gpu_busy_pct").is_not_null())
    if rows.is_empty():
        return Finding(
            "idlest phase", "no GPU activity in these phases (a CPU-only capture)", omitted=True
        )
    scope = ""
    if step is not None and step["wall_ms"]:
        long = rows.filter(pl.col("wall_ms") >= IDLE_MIN_SHARE * step["wall_ms"])
        if long.height < rows.height and long.height:
            rows, scope = long, f"; of the phases taking at least {IDLE_MIN_SHARE:.0%} of the step"
    low = rows.sort(["gpu_busy_pct", "wall_ms", "path"], descending=[False, True, False]).row(
        0, named=True
    )
    over = "whole capture" if low["n_steps"] is None else "median over steps"
    return Finding(
        "idlest phase",
        f"{low['path']} leaves the GPUs idlest: busy {low['gpu_busy_pct']:.1f}% of its "
        f"{_ms(low['wall_ms'])} ({over}{scope}).",
    )


def worst_straggler(tails: pl.DataFrame) -> Finding:
    """The step whose slowest generating rank kept another waiting longest."""
    topic = "worst straggler step"
    if tails.is_empty() or tails["pid"].n_unique() < 2:
        return Finding(
            topic,
            "fewer than two ranks mark generation (generate_sequences or generation ranges)",
            omitted=True,
        )
    waiting = tails.sort(["idle_tail_ns", "step", "pid"], descending=[True, False, False]).row(
        0, named=True
    )
    step = waiting["step"]
    if not waiting["idle_tail_ns"]:
        return Finding(topic, "every rank finished generating at the same time in every step.")
    in_step = tails.filter(pl.col("step") == step)
    slow = in_step.filter(pl.col("is_straggler")).sort("pid").row(0, named=True)
    gen_ns = waiting["last_end_ns"] - in_step["gen_start_ns"].min()
    share = f" ({100 * waiting['idle_tail_ns'] / gen_ns:.0f}% of the step's generation)"

    def who(row: dict) -> str:
        device = row.get("device")
        return f"pid {row['pid']}" + (f" (GPU {device})" if device else "")

    return Finding(
        topic,
        f"step {step} has the worst straggler: {who(slow)} finished generating "
        f"{_ms(waiting['idle_tail_ns'] / 1e6)} after {who(waiting)}, whose GPU waited that "
        f"long{share if gen_ns > 0 else ''}.",
    )


def largest_energy_share(inside: pl.DataFrame, step: dict | None, has_power: bool) -> Finding:
    """The phase with the largest median energy, as a share of the step's."""
    topic = "largest energy share"
    rows = inside.filter(pl.col("energy_j").is_not_null())
    if not has_power or rows.is_empty():
        return Finding(
            topic, "no power samples (capture them with nvtx-phases profile --power)", omitted=True
        )
    top = rows.sort(["energy_j", "path"], descending=[True, False]).row(0, named=True)
    whole = step["energy_j"] if step is not None and step["energy_j"] else rows["energy_j"].sum()
    of = "the step's" if step is not None and step["energy_j"] else "these phases'"
    return Finding(
        topic,
        f"{top['path']} uses the largest share of energy: {top['energy_j']:,.2f} J of {of} "
        f"{whole:,.2f} J ({100 * top['energy_j'] / whole:.0f}%, medians over steps).",
    )


def what_stands_out(analysis: Analysis, summary: pl.DataFrame) -> list[Finding]:
    """The four findings, from the phase summary (:func:`~analysis.render.report.phase_summary`)."""
    from analysis.workload.stragglers import generation_tails

    if summary.is_empty():
        n_ranges = analysis.summary.n_ranges
        why = f"no phases in this run (none of its {n_ranges:,} NVTX ranges is a phase)"
        return [
            Finding(t, why, omitted=True)
            for t in (
                "largest phase",
                "idlest phase",
                "worst straggler step",
                "largest energy share",
            )
        ]
    inside, step = top_phases(summary)
    has_power = analysis.summary.energy is not None
    return [
        largest_phase(inside, step),
        idlest_phase(inside, step),
        worst_straggler(generation_tails(analysis)),
        largest_energy_share(inside, step, has_power),
    ]
