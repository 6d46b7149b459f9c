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
    from ..model import Analysis
    from ..workload.study import StudyRun


@dataclass(frozen=True)
class StudyOutputs:
    """What ``study`` wrote, whom it left out (label → why) and the figures not drawn (why)."""

    written: list[Path]
    left_out: dict[str, str]
    not_drawn: dict[str, str]
    n_rows: int


def _open(run: StudyRun, reporter: Reporter) -> Analysis:
    """One study run's analysis, with its ``power`` file when the study gives one."""
    power: dict[str, Any] = {} if run.power is None else {"power_files": (run.power,)}
    return open_run(list(run.paths), label=run.label, reporter=reporter, **power)


def study_to(file: Path, out: Path, *, reporter: Reporter = QUIET) -> StudyOutputs:
    """Parse ``file`` (:func:`analysis.workload.study.parse_study`), load its runs, write all."""
    import polars as pl

    from ..errors import AnalysisError, one_line
    from ..render.figures import study as figures
    from ..render.report.study import write_study_report
    from ..workload.lengths import read_packed_lengths
    from ..workload.study import STUDY_METRICS, parse_study, tidy_table
    from ..workload.study_views import length_summary

    study = parse_study(file)
    unreadable: dict[str, str] = {}
    with ExitStack() as stack:
        analyses: dict[str, Analysis] = {}
        for run in study.runs:
            try:
                analyses[run.label] = stack.enter_context(_open(run, reporter))
            except AnalysisError as exc:
                unreadable[run.label] = one_line(str(exc))
        reporter.stage("writing the study table")
        tidy, left = tidy_table(study, analyses)
    left = {**unreadable, **left}
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "study.csv"]
    tidy.write_csv(written[0])
    metrics = pl.DataFrame(
        [vars(m) for m in STUDY_METRICS],
        schema={c: pl.String for c in ("name", "unit", "definition", "source", "column")},
    )
    metrics.write_csv(out / "study_metrics.csv")
    written.append(out / "study_metrics.csv")

    responses: dict[str, pl.DataFrame] = {}
    for run in study.runs:
        if run.label in left:
            continue
        folder = run.lengths or find_lengths(list(run.paths))
        if folder is None:
            continue
        try:
            responses[run.label] = read_packed_lengths([folder])
        except AnalysisError as exc:
            reporter.note(f"{run.label}: lengths not read ({one_line(str(exc))})")
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
        "response-length structure": figures.lengths(responses, summary, task_of, fig_dir),
        "scaling": figures.scaling(
            tidy,
            fig_dir,
            samples=dict(zip(summary["run"], summary["responses_per_step"], strict=True))
            if not summary.is_empty()
            else None,
        ),
    }
    not_drawn = {q: r for q, r in drawn.items() if isinstance(r, str)}
    pngs = [p for r in drawn.values() if not isinstance(r, str) for p in r]
    written += pngs
    written += write_study_report(study, tidy, summary, left, not_drawn, pngs, out)
    return StudyOutputs(written=written, left_out=left, not_drawn=not_drawn, n_rows=tidy.height)
