"""``study``: a study file's runs loaded; its tidy table, figures and report written."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import QUIET, Reporter
from .lengths_dir import find_lengths
from .run import open_run

if TYPE_CHECKING:
    import polars as pl

    from ..model import Analysis
    from ..workload.study import StudyRun
    from ..workload.study_sources import LoadedRun


@dataclass(frozen=True)
class StudyOutputs:
    """What ``study`` wrote, whom it left out (label → why) and the figures not drawn (why)."""

    written: list[Path]
    left_out: dict[str, str]
    not_drawn: dict[str, str]
    n_rows: int


def _open(run: StudyRun, reporter: Reporter) -> Analysis:
    """One study run's analysis, with its ``power``, ``phase_map`` and ``all_ranges`` options."""
    options: dict[str, Any] = {"all_ranges": run.all_ranges}
    if run.power is not None:
        options["power_files"] = (run.power,)
    if run.phase_map is not None:
        options["phase_map"] = run.phase_map
    return open_run(list(run.paths), label=run.label, reporter=reporter, **options)


def _records(run: StudyRun) -> Path | None:
    """The run's record folder: its ``lengths``, else one found beside its traces."""
    from ..workload.records import KNOWN

    return run.lengths or find_lengths(list(run.paths), patterns=KNOWN)


def _load(run: StudyRun, stack: ExitStack, reporter: Reporter) -> LoadedRun:
    """One run's analysis (with its tokens), log values and records, as the sources read them."""
    from ..errors import AnalysisError, one_line
    from ..workload.lengths import read_packed_lengths
    from ..workload.records import record_files
    from ..workload.study_sources import LoadedRun
    from ..workload.tokens import read_step_tokens, with_step_tokens
    from ..workload.verl_logs import latest_values, read_logs

    records = _records(run)
    responses: pl.DataFrame | None = None
    if records is not None:
        try:
            packed = record_files([records]).packed
            responses = read_packed_lengths(packed) if packed else None
        except AnalysisError as exc:
            reporter.note(f"{run.label}: lengths not read ({one_line(str(exc))})")
    values = latest_values(read_logs(run.verl_logs)) if run.verl_logs else None
    analysis = None
    if run.paths:
        analysis = stack.enter_context(_open(run, reporter))
        tokens = read_step_tokens(
            lengths=records if responses is not None else None, verl_logs=run.verl_logs
        )
        before = len(analysis.warnings)
        analysis = with_step_tokens(analysis, tokens)
        for line in analysis.warnings[before:]:  # the token counts' own warnings
            reporter.note(f"{run.label}: warning: {line}")
    return LoadedRun(
        label=run.label,
        analysis=analysis,
        log_values=values,
        records=(records,) if records is not None else (),
        responses=responses,
    )


def study_to(file: Path, out: Path, *, reporter: Reporter = QUIET) -> StudyOutputs:
    """Parse ``file`` (:func:`analysis.workload.study.parse_study`), load its runs, write all."""
    import polars as pl

    from ..errors import AnalysisError, one_line
    from ..render.figures import study as figures
    from ..render.report.study import write_study_report
    from ..workload.study import parse_study, tidy_table
    from ..workload.study_metrics import STUDY_METRICS
    from ..workload.study_views import length_summary

    study = parse_study(file)
    unreadable: dict[str, str] = {}
    with ExitStack() as stack:
        loaded: dict[str, LoadedRun] = {}
        for run in study.runs:
            try:
                loaded[run.label] = _load(run, stack, reporter)
            except AnalysisError as exc:
                unreadable[run.label] = one_line(str(exc))
        reporter.stage("writing the study table")
        tidy, left = tidy_table(study, loaded)
    left = {**unreadable, **left}
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "study.csv"]
    tidy.write_csv(written[0])
    metrics = pl.DataFrame(
        [vars(m) for m in STUDY_METRICS],
        schema={c: pl.String for c in ("name", "unit", "definition", "source", "column", "scope")},
    )
    metrics.write_csv(out / "study_metrics.csv")
    written.append(out / "study_metrics.csv")

    responses = {
        label: run.responses
        for label, run in loaded.items()
        if run.responses is not None and label not in left
    }
    summary = length_summary(responses)
    if not summary.is_empty():
        summary.write_csv(out / "study_lengths.csv")
        written.append(out / "study_lengths.csv")

    reporter.stage("drawing the study's figures")
    fig_dir = out / "figures"
    fig_dir.mkdir(exist_ok=True)
    task_of = {
        r.label: str(r.axes.get("task", r.label)) for r in study.runs if r.label in responses
    }
    drawn: dict[str, list[Path] | str] = {
        "phase signature per policy": figures.phase_signature(tidy, fig_dir),
        "reward-paradigm cost": figures.reward_cost(tidy, fig_dir),
        "energy per token": figures.token_energy(tidy, fig_dir),
        "response-length structure": figures.lengths(responses, summary, task_of, fig_dir),
        "scaling": figures.scaling(tidy, fig_dir),
    }
    not_drawn = {q: r for q, r in drawn.items() if isinstance(r, str)}
    pngs = [p for r in drawn.values() if not isinstance(r, str) for p in r]
    written += pngs
    written += write_study_report(study, tidy, summary, left, not_drawn, pngs, out)
    return StudyOutputs(written=written, left_out=left, not_drawn=not_drawn, n_rows=tidy.height)
