"""Jobs on one run: open it (an analysis folder or traces), analyze to a folder, report, compare."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.attribute.phase_map import PhaseMap
    from analysis.model import Analysis
    from analysis.render.report import Section
    from analysis.run.load import Engine

from analysis.errors import one_line
from analysis.jobs.common import QUIET, Reporter

# --- one run: an analysis folder, or traces ------------------------------------------------------


def resolve_traces(paths: Sequence[Path], reporter: Reporter = QUIET) -> list[Path]:
    """The SQLite exports that files and folders stand for (see :mod:`analysis.run.inputs`).

    Files as given; ``.nsys-rep`` reports exported (the ``.sqlite`` beside a report reused when
    it is newer; each export made is a note); a folder for the exports and reports directly in it.
    """
    from analysis.run.inputs import resolve_trace_inputs

    return resolve_trace_inputs(paths, notify=reporter.note)


def is_analysis_folder(path: Path) -> bool:
    """Whether ``path`` is a folder ``analyze`` wrote (it holds ``phases.parquet``)."""
    return path.is_dir() and (path / "phases.parquet").exists()


def analysis_folder(inputs: Sequence[Path]) -> Path | None:
    """The analysis folder ``inputs`` name (a single one), or None: they are traces."""
    if len(inputs) == 1 and is_analysis_folder(inputs[0]):
        return inputs[0]
    return None


def load_saved_analysis(folder: Path) -> Analysis:
    """:func:`analysis.render.files.load_analysis`; a damaged file is a ``SavedAnalysisError``."""
    import polars as pl

    from analysis.errors import SavedAnalysisError
    from analysis.render.files import load_analysis

    try:
        return load_analysis(folder)
    except (pl.exceptions.PolarsError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SavedAnalysisError(
            f"{folder}: cannot read this analysis folder ({one_line(str(exc))}); "
            "run `nvtx-phases analyze` again"
        ) from exc


def open_run(
    inputs: Sequence[Path],
    *,
    label: str | None = None,
    phase_map: PhaseMap | None = None,
    idle_power_w: float | None = None,
    force_combine: bool = False,
    reporter: Reporter = QUIET,
) -> Analysis:
    """One run's :class:`~analysis.model.Analysis`, from its analysis folder or its traces.

    Traces are analyzed (stage "analyzing LABEL…" first) with ``phase_map``, ``idle_power_w``
    and ``force_combine``. The caller closes the result (``with open_run(...) as run:``).
    """
    from analysis.run.pipeline import analyze

    folder = analysis_folder(inputs)
    if folder is not None:
        return load_saved_analysis(folder)
    reporter.stage(f"analyzing {label}…" if label else "analyzing…")
    return analyze(
        resolve_traces(inputs, reporter),
        phase_map=phase_map,
        idle_power_w=idle_power_w,
        progress=reporter.detail,
        force_combine=force_combine,
    )


def _phase_map(path: Path | None, all_ranges: bool) -> PhaseMap:
    from analysis.attribute.phase_map import default_phase_map, load_phase_map

    pmap = load_phase_map(path) if path else default_phase_map()
    return pmap.with_all_ranges() if all_ranges else pmap


# --- analyze, report, compare --------------------------------------------------------------------


@dataclass(frozen=True)
class AnalysisOutputs:
    """An analysis and the files written from it; closing it (``with``) closes the analysis."""

    analysis: Analysis
    written: list[Path]

    def close(self) -> None:
        """Remove the analysis's temporary files (:meth:`analysis.model.Analysis.close`)."""
        self.analysis.close()

    def __enter__(self) -> AnalysisOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def analyze_to(
    traces: Sequence[Path],
    out: Path,
    *,
    phase_map: Path | None = None,
    all_ranges: bool = False,
    power_files: Sequence[Path] | None = None,
    idle_power_w: float | None = None,
    figures: bool = True,
    jobs: int = 1,
    engine: Engine = "process",
    chunk_ops: int | None = None,
    spill_dir: Path | None = None,
    force_combine: bool = False,
    reporter: Reporter = QUIET,
) -> AnalysisOutputs:
    """Analyze one run's traces and write its tables (and figures) to ``out``: ``analyze``.

    ``out`` is checked before anything else, and afterwards holds this run's files only.
    ``phase_map``: a TOML file; ``all_ranges``: every NVTX range is a phase. The other options
    are :func:`analysis.run.pipeline.analyze`'s (``chunk_ops`` None: its default).
    """
    from analysis.render.files import check_output_folder, output_folder, write_outputs
    from analysis.run.pipeline import analyze

    check_output_folder(out)  # before exporting .nsys-rep reports and analyzing
    files = resolve_traces(traces, reporter)
    pmap = _phase_map(phase_map, all_ranges)
    reporter.begin(len(files))
    result = analyze(
        files,
        phase_map=pmap,
        power_files=power_files,
        idle_power_w=idle_power_w,
        progress=reporter.detail,
        jobs=jobs,
        engine=engine,
        on_file_done=reporter.file_done,
        **({"chunk_ops": chunk_ops} if chunk_ops else {}),
        spill_dir=spill_dir,
        force_combine=force_combine,
    )
    with ExitStack() as on_error:
        on_error.callback(result.close)
        reporter.stage("writing outputs")
        with output_folder(out) as session:  # afterwards out holds this run's files only
            written = session.add(write_outputs(result, out))
            if figures:
                from analysis.render.figures import write_figures  # matplotlib only when drawing

                reporter.stage("drawing figures")
                written += session.add(write_figures(result, out / "figures"))
        on_error.pop_all()
    return AnalysisOutputs(result, written)


def find_lengths(inputs: Sequence[Path]) -> Path | None:
    """A folder of packed_lengths files beside the inputs, if there is one."""
    for path in inputs:
        for candidate in (
            path.with_name(path.stem + "_lengths"),
            path / "lengths",
            path.parent / "lengths",
        ):
            if candidate.is_dir() and any(candidate.glob("packed_lengths_step_*.jsonl")):
                return candidate
    return None


def build_report(
    inputs: Sequence[Path],
    out: Path,
    *,
    lengths: Path | None = None,
    cap: int | None = None,
    idle_power_w: float | None = None,
    force_combine: bool = False,
    reporter: Reporter = QUIET,
) -> list[Path]:
    """Write report.html and report.md (and the figures) of one run to ``out``: ``report``.

    ``inputs``: an analysis folder, or the run's traces (then their tables are written too).
    ``lengths``: response-length records (default: :func:`find_lengths`) add length, straggler
    and energy-per-token sections; ``cap`` is the rollout's max response length.
    """
    from analysis.render.figures import write_figures
    from analysis.render.files import (
        TABLE_NAMES,
        check_output_folder,
        output_folder,
        same_folder,
        write_outputs,
    )
    from analysis.render.report import write_report

    check_output_folder(out)  # before a long analysis, not after it
    folder = analysis_folder(inputs)
    with open_run(
        inputs, idle_power_w=idle_power_w, force_combine=force_combine, reporter=reporter
    ) as result:
        # out ends up holding this run's files only; an analysis drawn from out itself stays
        keep = TABLE_NAMES if folder is not None and same_folder(folder, out) else ()
        with output_folder(out, keep=keep) as session:
            if folder is None:
                reporter.stage("writing outputs")
                session.add(write_outputs(result, out))
            reporter.stage("drawing figures")
            figures = session.add(write_figures(result, out / "figures"))
            sections: list[Section] = []
            length_dir = lengths or find_lengths(inputs)
            if length_dir is not None:
                sections, drawn = _length_sections(result, length_dir, cap, out / "figures")
                figures += session.add(drawn)
            return session.add(write_report(result, out, figures, sections))


def _length_sections(
    result: Analysis, length_dir: Path, cap: int | None, figures: Path
) -> tuple[list[Section], list[Path]]:
    """The report's length sections and their figures."""
    from analysis.render.length_figures import length_cdf, length_heatmap, straggler_timeline
    from analysis.workload.lengths import length_stats, read_packed_lengths
    from analysis.workload.stragglers import energy_per_token, generation_tails

    responses = read_packed_lengths([length_dir])
    stats = length_stats(responses, cap=cap)
    tails = generation_tails(result, stats)
    sections: list[Section] = [
        ("Response lengths per step", stats),
        ("Rollout stragglers", tails),
        ("Energy per generated token", energy_per_token(result, stats)),
    ]
    drawn = length_cdf(responses, figures) + length_heatmap(responses, figures)
    return sections, drawn + straggler_timeline(tails, figures)


def compare_to(
    runs: Mapping[str, Path],
    out: Path,
    *,
    phase_map: Path | None = None,
    all_ranges: bool = False,
    reporter: Reporter = QUIET,
) -> list[Path]:
    """Compare labelled runs (analysis folders or traces) phase by phase into ``out``: ``compare``.

    ``phase_map``/``all_ranges`` apply to runs given as traces (a note for each analysis folder).
    Writes :func:`analysis.render.comparison.write_comparison`'s files, ``compare.md`` among them.
    """
    from analysis.render.comparison import write_comparison

    pmap = _phase_map(phase_map, all_ranges)
    with ExitStack() as stack:
        analyses: dict[str, Analysis] = {}
        for label, run in runs.items():
            if is_analysis_folder(run) and (phase_map or all_ranges):
                reporter.note(f"{run} was analyzed already; --phase-map/--all-ranges not applied")
            analyses[label] = stack.enter_context(
                open_run([run], label=label, phase_map=pmap, reporter=reporter)
            )
        reporter.stage("writing the comparison")
        return write_comparison(analyses, out)
