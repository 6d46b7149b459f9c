"""Trace phase times against VeRL's own timers (``timing_s/*``), per step and stage.

VeRL logs ``timing_s/<stage>`` per step through its console logger (``step:3 - timing_s/gen:12.3
- …``, possibly behind a Ray prefix such as ``(TaskRunner pid=1234)`` and with ANSI colour codes,
which are stripped) or its file logger (JSON lines ``{"step": 3, "data": {...}}``). Older VeRL
releases named the same timers ``timing/<stage>`` (also seconds); they are read too, and where a
step has both, ``timing_s/`` wins. Values printed by numpy 2's repr (``np.float64(12.3)``) parse
as numbers. ``error_pct = (trace − logged) / logged × 100``; a stage's accuracy is
``100 − mean |error_pct|`` over steps, and the overall accuracy the same over every (stage,
step) pair: the measure PolyTrace reports for its benchmark against real runs. Pairs that VeRL
logged under ``MIN_SCORED_S`` (1 ms) stay in the rows and the per-stage table but not in the
overall accuracy: there a relative error measures the timers' own overhead (an NVTX push/pop and
VeRL's ``marked_timer`` cost tens of µs; a 11 µs ``reward`` stage traced at 37 µs is "+229%"),
not where the time went; the summary lists them (``unscored_stages``).

Steps are paired by number when the trace's steps carry VeRL's numbers (``nvtx_phases.verl``
puts ``global_steps``, counted from 1, in each range's payload). VeRL's own ``step`` ranges carry
no number, and ``analyze`` numbers such ranges 0, 1, … in start order: when the trace's steps are
exactly 0…n−1 and the log has no step 0, they are paired by order instead (the k-th traced step
with the k-th logged step), and the summary says so (``step_alignment``): that pairing assumes
the capture starts with the first logged step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

import polars as pl

from nvtx_phases.naming import PATH_SEP, STEP

from ..errors import InputError, WorkloadInputError
from ..model import WINDOW, Analysis
from ..phase_paths import is_step_phase
from ..render.report.units import duration, fixed
from .fidelity_scores import MIN_SCORED_S, stage_accuracy

SAME_RUN_MIN_ACCURACY_PCT = 50.0
"""Under this overall accuracy the log and the trace look like different runs (one run scores
~99%: VeRL's timers and its NVTX ranges wrap the same code)."""
SAME_RUN_MAX_TIME_RATIO = 2.0
"""The median of trace ÷ logged time over the scored pairs beyond this factor either way: the
two look like different runs (other hardware, model or batch)."""

STAGES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "step",
)
_CONSOLE = re.compile(r"(?<![\w/])step:(\d+) - (.*)$")
_PAIR = re.compile(
    r"([\w/@.\-]+):(?:np\.\w+\()?(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\)?(?= - |\s*$)"
)
#: ANSI escape sequences (Ray colours its ``(TaskRunner pid=…)`` prefixes) and carriage returns
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\r")
#: timer key prefixes, newest first: VeRL's ``timing_s/`` and its older ``timing/``
TIMING_PREFIXES = ("timing_s/", "timing/")


def read_verl_log(path: str | Path) -> pl.DataFrame:
    """``step, key, value`` for every numeric metric in a VeRL console or JSON-lines log."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    rows: list[tuple[int, str, float]] = []
    for line in text.splitlines():
        line = _ANSI.sub("", line).strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if (
                isinstance(step, int)
                and not isinstance(step, bool)
                and isinstance(record.get("data"), dict)
            ):
                rows += [
                    (step, str(k), float(v))
                    for k, v in record["data"].items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                ]
            continue
        match = _CONSOLE.search(line)
        if match:
            step = int(match.group(1))
            rows += [(step, k, float(v)) for k, v in _PAIR.findall(match.group(2))]
    if not rows:
        raise WorkloadInputError(
            f"{path}: no VeRL metrics found (console 'step:N - key:value' or file-logger JSON lines)"
        )
    return pl.DataFrame(
        rows, schema={"step": pl.Int64, "key": pl.String, "value": pl.Float64}, orient="row"
    )


def stage_times(analysis: Analysis) -> pl.DataFrame:
    """Per step and stage: the trace's wall time of the driver phase (s)."""
    rows = analysis.phases.filter(pl.col("step").is_not_null() & (pl.col("attribution") == WINDOW))
    stage = (
        pl.when(pl.col("path") == STEP)
        .then(pl.lit(STEP))
        .otherwise(pl.col("path").str.strip_prefix(STEP + PATH_SEP))
    )
    ends = pl.DataFrame(
        [(t.label, t.capture_end_ns) for t in analysis.summary.traces],
        schema={"trace": pl.String, "_capture_end_ns": pl.Int64},
        orient="row",
    )
    return (
        rows.filter((pl.col("path") == STEP) | is_step_phase())
        .with_columns(stage.alias("stage"))
        .join(ends, on="trace", how="left")
        .group_by("step", "stage")
        .agg(
            (pl.col("wall_ns").sum() / 1e9).alias("trace_s"),
            # nsys ended a range still open at the capture's end there: not its real end
            (pl.col("end_ns") == pl.col("_capture_end_ns")).fill_null(False).any().alias("cut"),
        )
    )


def logged_stage_times(log: pl.DataFrame) -> pl.DataFrame:
    """``step, stage, logged_s``: VeRL's timer per step and stage (``timing_s/`` over ``timing/``).

    A key logged more than once for a step (a restarted run) keeps its last value.
    """
    frames = []
    for rank, prefix in enumerate(TIMING_PREFIXES):
        frames.append(
            log.filter(pl.col("key").str.starts_with(prefix)).with_columns(
                pl.col("key").str.strip_prefix(prefix).alias("stage"),
                pl.lit(rank).alias("_prefix_rank"),
            )
        )
    return (
        pl.concat(frames)
        .filter(pl.col("stage").is_in(STAGES))
        .with_row_index("_order")
        .sort("step", "stage", "_prefix_rank", "_order")
        .group_by("step", "stage", maintain_order=True)
        .agg(
            pl.col("value")
            .filter(pl.col("_prefix_rank") == pl.col("_prefix_rank").min())
            .last()
            .alias("logged_s")
        )
    )


def align_steps(trace_steps: list[int], logged_steps: list[int]) -> dict:
    """How traced steps pair with logged steps: ``mode``, ``pairs`` ([trace, logged]), ``note``.

    ``number`` when the trace's steps are VeRL's numbers; ``order`` when they are the 0, 1, …
    that ``analyze`` gives ``step`` ranges without payload and the log has no step 0.
    """
    trace, logged = sorted(set(trace_steps)), sorted(set(logged_steps))
    if trace and trace == list(range(len(trace))) and logged and 0 not in logged:
        pairs = [[t, s] for t, s in zip(trace, logged, strict=False)]
        note = (
            "steps paired by order: the trace's step ranges carry no step number (numbered "
            f"0…{len(trace) - 1} by analyze), VeRL's log numbers its steps from {logged[0]}; "
            f"{len(pairs)} pair(s), {_pair_text(pairs)}"
        )
        return {"mode": "order", "pairs": pairs, "note": note}
    pairs = [[t, t] for t in trace if t in set(logged)]
    return {"mode": "number", "pairs": pairs, "note": "steps paired by number"}


def _pair_text(pairs: list[list[int]], most: int = 4) -> str:
    shown = ", ".join(f"trace {t} ↔ VeRL {s}" for t, s in pairs[:most])
    return shown + (", …" if len(pairs) > most else "")


def compare_with_log(analysis: Analysis, log: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """Per (step, stage) errors, and a summary per stage plus overall accuracy.

    ``step`` in the rows is VeRL's (logged) step; ``trace_step`` the trace's own index.
    """
    logged = logged_stage_times(log)
    traced = stage_times(analysis).rename({"step": "trace_step"})
    alignment = align_steps(traced["trace_step"].to_list(), logged["step"].to_list())
    pairs = pl.DataFrame(
        alignment["pairs"] or None,
        schema={"trace_step": pl.Int64, "step": pl.Int64},
        orient="row",
    )
    both = (
        traced.with_columns(pl.col("trace_step").cast(pl.Int64))
        .join(pairs, on="trace_step", how="inner")
        .join(logged, on=["step", "stage"], how="inner")
        .filter(pl.col("logged_s") > 0)
        .select("step", "trace_step", "stage", "trace_s", "logged_s", "cut")
    )
    both = both.with_columns(
        ((pl.col("trace_s") - pl.col("logged_s")) / pl.col("logged_s") * 100).alias("error_pct")
    ).sort("step", "stage")
    cut_pairs = [[r["step"], r["stage"]] for r in both.filter("cut").iter_rows(named=True)]
    # a stage VeRL timed in a paired step that the trace lacks (its range never flushed)
    missing = (
        logged.join(pairs, on="step", how="semi")
        .filter(pl.col("logged_s") > 0)
        .join(both, on=["step", "stage"], how="anti")
        .sort("step", "stage")
    )
    rows_out = both.rename({"cut": "cut_at_capture_end"})
    both = both.filter(~pl.col("cut")).drop("cut")
    per_stage, scored, unscored, overall = stage_accuracy(both)
    summary = {
        "stages": {row.pop("stage"): row for row in per_stage.iter_rows(named=True)},
        "overall_accuracy_pct": overall,
        "n_pairs": both.height,
        "n_scored_pairs": scored.height,
        "min_scored_logged_s": MIN_SCORED_S,
        "unscored_stages": unscored,
        "matched_steps": sorted(both["step"].unique().to_list()),
        "step_alignment": alignment,
        "cut_pairs": cut_pairs,
        "missing_in_trace": [[r["step"], r["stage"]] for r in missing.iter_rows(named=True)],
    }
    summary["same_run"] = same_run_check(
        traced["trace_step"].to_list(),
        logged["step"].to_list(),
        alignment["pairs"],
        scored,
        cast("float | None", summary["overall_accuracy_pct"]),
    )
    return rows_out, summary


def same_run_check(
    trace_steps: list[int],
    logged_steps: list[int],
    pairs: list[list[int]],
    scored: pl.DataFrame,
    overall_accuracy_pct: float | None,
) -> dict:
    """Whether the log and the trace look like different runs, and why.

    Signs (each a ``reasons`` entry): the trace holds steps the log has no timers for (the log
    may time more steps than a capture holds: a capture of some steps is normal, and only
    noted); overall accuracy under :data:`SAME_RUN_MIN_ACCURACY_PCT`; the median of trace ÷
    logged time over the scored pairs beyond :data:`SAME_RUN_MAX_TIME_RATIO` either way.
    """
    from ..step_spec import steps_text

    trace, logged = sorted(set(trace_steps)), sorted(set(logged_steps))
    unpaired = sorted(set(trace) - {t for t, _ in pairs})
    ratio = (
        float(cast(float, (scored["trace_s"] / scored["logged_s"]).median()))
        if scored.height
        else None
    )
    reasons = []
    if unpaired:
        reasons.append(
            f"the trace has {len(trace)} step(s), the log times {len(logged)}: trace step(s) "
            f"{steps_text(unpaired)} have no timers in the log"
        )
    if overall_accuracy_pct is not None and overall_accuracy_pct < SAME_RUN_MIN_ACCURACY_PCT:
        reasons.append(
            f"overall accuracy {overall_accuracy_pct:.2f}% (under {SAME_RUN_MIN_ACCURACY_PCT:g}%)"
        )
    limit = SAME_RUN_MAX_TIME_RATIO
    if ratio is not None and not 1 / limit <= ratio <= limit:
        reasons.append(
            f"the trace's times are {ratio:.3g}× the log's (median over {scored.height} "
            f"pairs; one run gives about 1×, the limit is {limit:g}× either way)"
        )
    note = None
    if not unpaired and len(logged) > len(trace):
        note = (
            f"the log times {len(logged)} steps, the trace holds {len(trace)}: only the steps "
            "in both are compared"
        )
    return {
        "different_runs": bool(reasons),
        "reasons": reasons,
        "n_trace_steps": len(trace),
        "n_logged_steps": len(logged),
        "median_time_ratio": ratio,
        "note": note,
    }


def mismatch_warning(summary: dict) -> str | None:
    """The one-line warning when the log and the trace look like different runs (else None)."""
    check = summary.get("same_run") or {}
    if not check.get("different_runs"):
        return None
    return "the log and the trace look like different runs: " + "; ".join(check["reasons"])


def _pair_list(pairs: list[list]) -> str:
    """``step 2 update_weights, step 3 step`` from ``[[step, stage], …]``."""
    return ", ".join(f"step {step} {stage}" for step, stage in pairs)


def to_markdown(summary: dict, *, warning: bool = True) -> str:
    """The per-stage table and the overall accuracy.

    Times in the unit that reads best (``15.26 µs``, ``33.12 s``: 4 significant digits);
    percentages to 0.01, a nonzero one under that as ``<0.01`` (``+<0.01``), never ``0.00``,
    and one below 100 never as ``100.00`` (:func:`analysis.render.report.units.fixed`).

    ``warning``: start with :func:`mismatch_warning`'s line, when there is one.
    """
    mismatch = mismatch_warning(summary) if warning else None
    lines = [f"**Warning:** {mismatch[0].upper()}{mismatch[1:]}.", ""] if mismatch else []
    lines += [
        "| stage | steps | logged (mean) | trace (mean) | error % (mean) | |error| % | accuracy % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    unscored = set(summary.get("unscored_stages", []))
    for stage, row in summary["stages"].items():
        accuracy = "not scored" if stage in unscored else fixed(row["accuracy_pct"], 2, pct=True)
        lines.append(
            f"| {stage} | {row['n_steps']} | {duration(row['mean_logged_s'])} | "
            f"{duration(row['mean_trace_s'])} | {fixed(row['mean_error_pct'], 2, sign=True)} | "
            f"{fixed(row['mean_abs_error_pct'], 2)} | {accuracy} |"
        )
    overall = summary["overall_accuracy_pct"]
    scored_pairs = summary.get("n_scored_pairs", summary["n_pairs"])
    lines += [
        "",
        f"Overall accuracy: {fixed(overall, 2, pct=True)}% over {scored_pairs} (step, stage) pairs"
        if overall is not None
        else "No step matched (or none logged at or above 1 ms).",
    ]
    if summary.get("unscored_stages"):
        lines += [
            "",
            "Not in the overall accuracy (logged under "
            f"{summary['min_scored_logged_s'] * 1000:g} ms, where the error measures "
            "the timers' own overhead): " + ", ".join(summary["unscored_stages"]) + ".",
        ]
    if summary.get("cut_pairs"):
        lines += [
            "",
            f"Not scored: {_pair_list(summary['cut_pairs'])}: a range of it ends exactly at the end of the capture (nsys "
            "closed it there; its process exited before its last NVTX events were flushed), so "
            "the trace does not hold its real duration.",
        ]
    if summary.get("missing_in_trace"):
        lines += [
            "",
            f"Logged by VeRL but not in the trace: {_pair_list(summary['missing_in_trace'])} (no such range in that step: a "
            "process that exited before its last NVTX events were flushed, or a stage the "
            "capture did not cover).",
        ]
    alignment = summary.get("step_alignment")
    if alignment and alignment["mode"] == "order":
        lines += ["", f"Note: {alignment['note']}."]
    same_run = summary.get("same_run") or {}
    if same_run.get("note"):
        lines += ["", f"Note: {same_run['note']}."]
    return "\n".join(lines) + "\n"
