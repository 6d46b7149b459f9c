"""Jobs on RLVR workload data: response lengths (statistics, fits) and fidelity to VeRL's timers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .common import QUIET, Reporter
from .rollouts import rollout_tables
from .run import open_run

if TYPE_CHECKING:
    import polars as pl

    from ..workload.lengths import CapChoice
    from ..workload.records import RecordFiles

# --- workload: lengths, fidelity -----------------------------------------------------------------


@dataclass(frozen=True)
class LengthsOutputs:
    """What :func:`analyze_lengths` made: per-step statistics, the cap, warnings, files written."""

    #: None where the paths hold no packed_lengths records (multi-turn or DAPO records only)
    stats: pl.DataFrame | None
    n_responses: int
    written: list[Path]
    #: the cap the "at cap" column uses: given, inferred or none (``cap.text()`` says which)
    cap: CapChoice | None = None
    #: one line each: records and run steps that do not match, fits refused as degenerate
    warnings: list[str] = field(default_factory=list)
    #: ``multiturn_steps.csv`` and ``dapo_steps.csv``'s tables, where there are such records
    multiturn: pl.DataFrame | None = None
    dapo: pl.DataFrame | None = None
    #: what the records cannot say (fields absent, sums that are not wall time), one line each
    notes: list[str] = field(default_factory=list)


def _atomic_text(path: Path, text: str) -> Path:
    from ..render.outputs.atomic import atomic_write

    return atomic_write(path, lambda p: p.write_text(text))


def analyze_lengths(
    paths: Sequence[Path],
    out: Path,
    *,
    cap: int | None = None,
    run: Path | None = None,
    fit: bool | None = None,
    task: str = "task",
    reporter: Reporter = QUIET,
) -> LengthsOutputs:
    """Length statistics, drift, rank imbalance and figures into ``out``: ``lengths analyze``.

    ``cap``: the rollout's max response length; None infers it
    (:func:`~analysis.workload.lengths.resolve_cap`). ``run`` (its analysis folder or traces)
    adds stragglers, phase imbalance and energy per token. ``fit``: True fits distributions
    (``MissingDependency`` without scipy and scikit-learn, before any work); None fits when they
    are installed, else notes the skip.
    """
    from ..workload.records import record_files

    files = record_files(paths)
    if not files.packed:
        if run is not None or fit:
            raise InputError(
                "--run and --fit need packed_lengths_step_*.jsonl records; "
                f"{', '.join(map(str, paths))} has none"
            )
        out_ = LengthsOutputs(stats=None, n_responses=0, written=[])
    else:
        out_ = _packed_outputs(files, out, cap, run, fit, task, reporter, paths)
    extra = rollout_tables(files, out)
    return LengthsOutputs(
        stats=out_.stats,
        n_responses=out_.n_responses,
        written=out_.written + extra.written,
        cap=out_.cap,
        warnings=out_.warnings + extra.warnings,
        multiturn=extra.multiturn,
        dapo=extra.dapo,
        notes=extra.notes,
    )


def _packed_outputs(
    files: RecordFiles,
    out: Path,
    cap: int | None,
    run: Path | None,
    fit: bool | None,
    task: str,
    reporter: Reporter,
    paths: Sequence[Path],
) -> LengthsOutputs:
    """The packed_lengths statistics, figures, stragglers with ``run`` and fits."""
    from ..errors import MissingDependency
    from ..render.figures.lengths import length_cdf, length_heatmap
    from ..render.outputs.atomic import atomic_write
    from ..workload import lengths as lw
    from ..workload.fits import FIT_HINT, missing_fit_dependencies

    missing = missing_fit_dependencies() if fit is not False else []
    if missing and fit:  # asked for explicitly
        raise MissingDependency(f"length fits need {' and '.join(missing)}: {FIT_HINT}")
    if missing:  # the default: everything else works without them
        reporter.note(
            f"length fits skipped: they need {' and '.join(missing)} ({FIT_HINT}); "
            "--no-fit skips them quietly"
        )
    responses = lw.read_packed_lengths(files.packed)
    rewards = lw.read_reward_timings(files.rewards)
    choice = lw.resolve_cap(responses, cap)
    stats = lw.length_stats(responses, cap=choice)
    warnings: list[str] = []
    written = [
        atomic_write(out / "length_stats.csv", stats.write_csv),
        atomic_write(out / "length_drift.csv", lw.drift(stats).write_csv),
        atomic_write(out / "rank_imbalance.csv", lw.rank_imbalance(responses, rewards).write_csv),
        *length_cdf(responses, out / "figures", cap=choice.value),
        *length_heatmap(responses, out / "figures", cap=choice.value),
    ]
    if run is not None:
        written += _run_length_files(run, responses, choice, out, warnings, reporter)
    if fit is not False and not missing:
        from ..workload.fits import fit_task, parameter_file, refused_fit_lines

        fitted = fit_task(responses, task)
        warnings += [f"fits.json: {line}" for line in refused_fit_lines(fitted)]
        params = parameter_file({task: fitted}, source=", ".join(map(str, paths)))
        written.append(_atomic_text(out / "fits.json", json.dumps(params, indent=2)))
    return LengthsOutputs(
        stats=stats,
        n_responses=responses.height,
        written=written,
        cap=choice,
        warnings=warnings,
    )


def _run_length_files(
    run: Path,
    responses: pl.DataFrame,
    cap: CapChoice,
    out: Path,
    warnings: list[str],
    reporter: Reporter,
) -> list[Path]:
    """Stragglers, phase imbalance and energy per token of ``run``, and the straggler figure.

    Appends to ``warnings`` where the records' steps and the run's do not match.
    """
    from ..render.figures.lengths import straggler_timeline
    from ..render.outputs.atomic import atomic_write
    from ..workload.stragglers import phase_imbalance, run_lengths

    with open_run([run], label=str(run), reporter=reporter) as analysis:
        tables = run_lengths(analysis, responses, cap)
        warnings += tables.warnings
        return [
            atomic_write(out / "stragglers.csv", tables.tails.write_csv),
            atomic_write(out / "phase_imbalance.csv", phase_imbalance(analysis).write_csv),
            atomic_write(out / "energy_per_token.csv", tables.energy.write_csv),
            *straggler_timeline(tables.tails, out / "figures"),
        ]


def fit_lengths(paths: Sequence[Path], out: Path, *, task: str = "task") -> dict[str, Any]:
    """Fit one task's lengths and write the parameter file ``out``: ``lengths fit``.

    Returns the task's entry (``output_distribution``, ``joint_distribution``, …).
    """
    from ..workload.fits import fit_task, parameter_file
    from ..workload.lengths import read_packed_lengths

    params = parameter_file(
        {task: fit_task(read_packed_lengths(paths), task)}, ", ".join(map(str, paths))
    )
    out.write_text(json.dumps(params, indent=2) + "\n", encoding="utf-8")
    fitted: dict[str, Any] = params[f"{task}_task"]
    return fitted


@dataclass(frozen=True)
class FidelityOutputs:
    """What :func:`fidelity_to` made: the Markdown of ``summary.md`` and the warnings."""

    #: ``summary.md``: the per-stage table, the overall accuracy, the notes
    text: str
    #: ``summary.json``'s object
    summary: dict[str, Any]
    #: one line each; the log and the trace looking like different runs
    warnings: list[str]


def fidelity_to(run: Path, log: Path, out: Path, *, reporter: Reporter = QUIET) -> FidelityOutputs:
    """Trace phase times vs a VeRL log's, written to ``out``: ``fidelity``.

    The log is read first: a missing one fails before a long analysis. ``summary.md`` starts
    with a warning when the two look like different runs (``summary.json``: ``same_run``).
    """
    from ..render.outputs.atomic import atomic_write
    from ..workload.fidelity import (
        compare_with_log,
        mismatch_warning,
        read_verl_log,
        to_markdown,
    )
    from ..workload.fidelity_async import compare_async, is_async_log
    from ..workload.verl_logs import read_log

    logged = read_verl_log(log)
    records = read_log(log)  # the fully async trainer's are told apart by their record layout
    with open_run([run], label=str(run), reporter=reporter) as analysis:
        if is_async_log(records):
            per_step, summary = compare_async(analysis, records)
        else:
            per_step, summary = compare_with_log(analysis, logged)
    text = to_markdown(summary)
    atomic_write(out / "fidelity_steps.csv", per_step.write_csv)
    _atomic_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    _atomic_text(out / "summary.md", text)
    warning = mismatch_warning(summary)
    return FidelityOutputs(text=text, summary=summary, warnings=[warning] if warning else [])
