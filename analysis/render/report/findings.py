"""The report's "what stands out": four sentences computed from its tables.

Each finding is a sentence with its numbers, or, when the data for it is missing (no power
samples, no GPU work, one rank), says so and why. The phases compared are those directly inside
``step`` (window scheme); a run without step ranges uses its top-level phases. Every share of
the step is :mod:`analysis.aggregate.shares`' (phase / step per step, then the median and
p10–p90 over steps), never a ratio of medians. Where ranges were cut at the capture's end, a
fifth line says which and what they are left out of (:func:`~analysis.aggregate.steps.cut_note`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ...aggregate.shares import inside_step, is_cut, share_over_steps, step_shares
from ...aggregate.steps import cut_note
from ...model import PROJECTION, WINDOW, Analysis
from ...phase_paths import is_step_phase
from .units import fixed


@dataclass(frozen=True)
class Finding:
    """One line of "what stands out": ``text``, or why it is left out (``omitted``)."""

    topic: str
    text: str
    omitted: bool = False


def _pct(value: float) -> str:
    """A share with one decimal, never a wrong ``0`` or ``100``."""
    return fixed(value, 1, pct=True)


def _ms(value: float) -> str:
    return f"{value / 1e3:,.2f} s" if value >= 10_000 else f"{value:,.2f} ms"


def _pct_range(row: dict, what: str, of: str) -> str:
    """``39.3% of the step (p10–p90 38.5–40.1%)`` from a :func:`share_over_steps` row."""
    median, low, high = (row[f"{what}_share_{q}"] for q in ("median", "p10", "p90"))
    return f"{_pct(median)}%{of} (p10–p90 {_pct(low)}–{_pct(high)}%)"


def shares_by_path(phases: pl.DataFrame) -> pl.DataFrame:
    """:func:`share_over_steps` keyed by phase ``path`` (``step/gen``) instead of canonical name.

    Empty without ``step`` ranges (no step to take a share of).
    """
    over = share_over_steps(step_shares(phases))
    # the rows behind the shares: a canonical name of another path (a worker's update_actor
    # beside the driver's step/update_actor) does not get their share
    paths = inside_step(phases).select("path", "canonical").unique("path", keep="first")
    return over.join(paths, on="canonical", how="inner")


def _share_of(shares: pl.DataFrame, path: str) -> dict | None:
    row = shares.filter(pl.col("path") == path)
    return row.row(0, named=True) if row.height else None


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
    inside = window.filter(is_step_phase())
    if inside.is_empty():
        inside = summary.filter(~pl.col("path").str.contains("/") & (pl.col("path") != "step"))
    return inside, (step.row(0, named=True) if step.height else None)


def largest_phase(inside: pl.DataFrame, shares: pl.DataFrame) -> Finding:
    """The phase with the largest median wall time, and its share of the step.

    ``shares``: :func:`shares_by_path`.
    """
    rows = inside.filter(pl.col("wall_ms").is_not_null())
    if rows.is_empty():
        return Finding("largest phase", "no phase with a duration", omitted=True)
    top = rows.sort(["wall_ms", "path"], descending=[True, False]).row(0, named=True)
    if top["n_steps"] is None:  # no step ranges
        text = f"{top['path']} takes the most time: {_ms(top['wall_ms'])} over the whole capture"
        return Finding("largest phase", text + ".")
    text = (
        f"{top['path']} takes the most time: {_ms(top['wall_ms'])} per step "
        f"(p10–p90 {_range(top['wall_ms_p10'], top['wall_ms_p90'])})"
    )
    share = _share_of(shares, top["path"])
    if share is not None and share["time_share_median"] is not None:
        text += f", {_pct_range(share, 'time', ' of the step')}"
    return Finding("largest phase", text + "; median over steps.")


def _busy(rows: pl.DataFrame) -> pl.DataFrame:
    """``busy``: what says how idle the GPUs were, and ``own``: whether it is own launches only.

    A window phase's GPU busy share; a worker (projection) range's process GPU busy share where
    the phase table has it, else its own-launch busy share, which the finding names as such.
    """
    process = (
        pl.col("process_gpu_busy_pct")
        if "process_gpu_busy_pct" in rows.columns
        else pl.lit(None, dtype=pl.Float64)
    )
    projection = pl.col("attribution") == PROJECTION
    own = projection & process.is_null()
    busy = pl.when(projection & ~own).then(process).otherwise(pl.col("gpu_busy_pct"))
    return rows.with_columns(busy.alias("busy"), own.alias("own"))


def idlest_phase(inside: pl.DataFrame, shares: pl.DataFrame) -> Finding:
    """The phase with the lowest GPU busy share (ties: the longer phase).

    Phases whose median share of the step (``shares``: :func:`shares_by_path`) is below
    :data:`IDLE_MIN_SHARE` are passed over (a 1 ms phase at 0% says little) unless every phase
    is that short. A worker (projection) range is judged by its process's GPU busy share
    (every operation of its process); without it, by the share of its own launches, named so.
    """
    rows = _busy(inside).filter(pl.col("busy").is_not_null())
    if rows.is_empty():
        return Finding(
            "idlest phase", "no GPU activity in these phases (a CPU-only capture)", omitted=True
        )
    if shares.height:
        share = rows.join(shares.select("path", "time_share_median"), on="path", how="left")
        long = share.filter(pl.col("time_share_median") >= 100 * IDLE_MIN_SHARE)
        scope = f"; of the phases taking at least {IDLE_MIN_SHARE:.0%} of the step"
    else:  # no step to take a share of: compare with the longest phase instead
        long = rows.filter(pl.col("wall_ms") >= IDLE_MIN_SHARE * pl.col("wall_ms").max())
        scope = f"; of the phases at least {IDLE_MIN_SHARE:.0%} as long as the longest"
    if long.height < rows.height and long.height:
        rows = long.select(rows.columns)
    else:
        scope = ""
    low = rows.sort(["busy", "wall_ms", "path"], descending=[False, True, False]).row(0, named=True)
    over = "whole capture" if low["n_steps"] is None else "median over steps"
    of = f"{_pct(low['busy'])}% of its {_ms(low['wall_ms'])} ({over}{scope}"
    if low["own"]:
        text = (
            f"{low['path']} (worker range) has the lowest busy share of its own launches: {of}; "
            "work launched by other threads of its process is not counted)."
        )
    elif low["attribution"] == PROJECTION:
        text = (
            f"{low['path']} (worker range) leaves its process's GPUs idlest: busy {of}; every "
            "operation of its process counted)."
        )
    else:
        text = f"{low['path']} leaves the GPUs idlest: busy {of})."
    return Finding("idlest phase", text)


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
    share = (
        f" ({fixed(100 * waiting['idle_tail_ns'] / gen_ns, 0, pct=True)}% of the step's generation)"
    )

    def who(row: dict) -> str:
        device = row.get("device")
        return f"pid {row['pid']}" + (f" (GPU {device})" if device else "")

    return Finding(
        topic,
        f"step {step} has the worst straggler: {who(slow)} finished generating "
        f"{_ms(waiting['idle_tail_ns'] / 1e6)} after {who(waiting)}, whose GPU waited that "
        f"long{share if gen_ns > 0 else ''}.",
    )


def largest_energy_share(inside: pl.DataFrame, shares: pl.DataFrame, has_power: bool) -> Finding:
    """The phase with the largest median share of the step's energy.

    ``shares``: :func:`shares_by_path`; without step energy, the phase using the most energy.
    """
    topic = "largest energy share"
    rows = inside.filter(pl.col("energy_j").is_not_null())
    if not has_power or rows.is_empty():
        return Finding(
            topic, "no power samples (capture them with nvtx-phases profile --power)", omitted=True
        )
    shared = rows.join(shares, on="path", how="inner").filter(
        pl.col("energy_share_median").is_not_null()
    )
    if shared.height:
        top = shared.sort(["energy_share_median", "path"], descending=[True, False]).row(
            0, named=True
        )
        return Finding(
            topic,
            f"{top['path']} uses the largest share of the step's energy: "
            f"{_pct_range(top, 'energy', '')}, {top['energy_j']:,.2f} J per step; median over steps.",
        )
    top = rows.sort(["energy_j", "path"], descending=[True, False]).row(0, named=True)
    over = "over the whole capture" if top["n_steps"] is None else "per step (median over steps)"
    return Finding(
        topic,
        f"{top['path']} uses the most energy: {top['energy_j']:,.2f} J {over} (no step energy "
        "to take a share of).",
    )


#: the topic of the line about ranges cut at the capture's end
CUT_TOPIC = "cut at the capture's end"


def _no_phases(analysis: Analysis) -> str:
    """Why the phase summary is empty: no phase at all, or every phase row cut."""
    phases = analysis.phases
    if phases.height and phases.filter(~is_cut(phases)).is_empty():
        return "every phase row holds a range cut at the capture's end (the last line says why)"
    n_ranges = analysis.summary.n_ranges
    return f"no phases in this run (none of its {n_ranges:,} NVTX ranges is a phase)"


def what_stands_out(analysis: Analysis, summary: pl.DataFrame) -> list[Finding]:
    """The four findings, from the phase summary (:func:`~analysis.render.report.document.phase_summary`).

    Then, where ranges were cut at the capture's end, a fifth saying what is left out and why.
    """
    from ...workload.stragglers import generation_tails

    note = cut_note(analysis.phases)
    cut = [Finding(CUT_TOPIC, note[0].upper() + note[1:])] if note else []
    if summary.is_empty():
        why = _no_phases(analysis)
        return [
            Finding(t, why, omitted=True)
            for t in (
                "largest phase",
                "idlest phase",
                "worst straggler step",
                "largest energy share",
            )
        ] + cut
    inside, _ = top_phases(summary)
    shares = shares_by_path(analysis.phases)
    has_power = analysis.summary.energy is not None
    return [
        largest_phase(inside, shares),
        idlest_phase(inside, shares),
        worst_straggler(generation_tails(analysis)),
        largest_energy_share(inside, shares, has_power),
        *cut,
    ]
