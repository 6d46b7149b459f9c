"""Jobs on one run: open it (an analysis folder or traces), analyze to a folder, report, compare."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model import Analysis
    from ..options import AnalyzeOptions
    from ..render.figures.drawing import Drawing
    from ..render.report.units import Section
    from ..workload.tokens import StepTokens

from ..errors import one_line
from .common import QUIET, Reporter
from .extras import envelope_drawer, length_sections, saved_envelope_figure
from .lengths_dir import lengths_beside

# --- one run: an analysis folder, or traces ------------------------------------------------------


def resolve_traces(paths: Sequence[Path], reporter: Reporter = QUIET) -> list[Path]:
    """The SQLite exports that files and folders stand for (see :mod:`analysis.run.inputs`).

    Files as given; ``.nsys-rep`` reports exported (the ``.sqlite`` beside a report reused when
    it is newer; each export made is a note); a folder for the exports and reports directly in it.
    """
    from ..run.inputs import resolve_trace_inputs

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
    """:func:`analysis.render.outputs.files.load_analysis`; a damaged file is a ``SavedAnalysisError``."""
    import polars as pl

    from ..errors import SavedAnalysisError
    from ..render.outputs.files import load_analysis

    try:
        return load_analysis(folder)
    except (pl.exceptions.PolarsError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SavedAnalysisError(
            f"{folder}: cannot read this analysis folder ({one_line(str(exc))}); "
            "run `nvtx-phases analyze` again"
        ) from exc


def open_run(
    inputs: Sequence[Path],
    options: AnalyzeOptions | None = None,
    *,
    label: str | None = None,
    reporter: Reporter = QUIET,
    **changes: Any,
) -> Analysis:
    """One run's :class:`~analysis.model.Analysis`, from its analysis folder or its traces.

    Traces are analyzed (stage "analyzing LABEL…" first) with ``options`` (or keywords naming
    its fields, as :func:`analysis.run.pipeline.analyze` takes them); an analysis folder is
    read as saved, its steps selected by ``options.steps``. The caller closes the result
    (``with open_run(...) as run:``).
    """
    from ..options import options_from
    from ..run.pipeline import analyze

    opts = options_from(options, changes)  # a bad spec or map fails before a long analysis
    folder = analysis_folder(inputs)
    if folder is None:
        reporter.stage(f"analyzing {label}…" if label else "analyzing…")
        return analyze(
            resolve_traces(inputs, reporter),
            opts,
            progress=reporter.detail,
            on_file_done=reporter.file_done,
        )
    run = load_saved_analysis(folder)
    if not opts.steps:
        return run
    from ..run.select import select_run
    from ..step_spec import parse_steps

    return select_run(run, parse_steps(opts.steps))


def refuse_trace_options(folder: Path, options: AnalyzeOptions) -> None:
    """An analysis folder keeps the options it was analyzed with: the phase options refused."""
    from ..errors import InputError

    if options.phase_map is not None or options.all_ranges or options.strip_args:
        raise InputError(
            f"--phase-map/--all-ranges/--strip-args apply to traces only: {folder} is an analysis "
            "folder, analyzed with its own options (analyze again with them, or report the traces)"
        )


def _invoked(result: Analysis, command_line: Sequence[str] | None, top: int | None) -> Analysis:
    """``result`` with the command line and ``top_kernels`` (the command's) in its provenance."""
    from ..run.provenance import with_invocation

    return with_invocation(result, command_line=command_line, options={"top_kernels": top})


def _with_warnings(result: Analysis, warnings: Sequence[str]) -> Analysis:
    """``result`` with ``warnings`` added to its summary's (the report lists them)."""
    if not warnings:
        return result
    import dataclasses

    summary = dataclasses.replace(result.summary, warnings=[*result.summary.warnings, *warnings])
    return dataclasses.replace(result, summary=summary)


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
    options: AnalyzeOptions | None = None,
    *,
    figures: bool = True,
    top_kernels: int | None = 10,
    command_line: Sequence[str] | None = None,
    detail_steps: str | None = None,
    draw_workers: int = 0,
    lengths: Path | None = None,
    verl_logs: Sequence[Path] = (),
    reporter: Reporter = QUIET,
    **changes: Any,
) -> AnalysisOutputs:
    """Analyze one run's traces and write its tables (and figures) to ``out``: ``analyze``.

    ``options``: :class:`~analysis.options.AnalyzeOptions` (or keywords naming its fields).
    ``out`` is checked before anything else, and afterwards holds this run's files only.
    ``top_kernels``: kernel names per phase in ``kernels_by_phase.csv`` (None or 0: all);
    ``command_line``: the CLI's, for the provenance in ``summary.json``. ``detail_steps``: the
    steps of the power detail figure (``--steps`` syntax; checked against the run's steps before
    anything is written); ``draw_workers``: processes drawing the figures meanwhile (0: here;
    see :mod:`analysis.render.figures.drawing`). ``lengths`` (length records) and ``verl_logs``:
    the run's tokens per step (:func:`analysis.workload.tokens.read_step_tokens`; read before the
    analysis, so bad input fails first), for ``step_tokens.csv`` and ``tokens_energy.csv``.
    """
    from ..options import options_from
    from ..render.figures.drawing import Drawing
    from ..render.outputs.files import check_output_folder
    from ..run.pipeline import analyze
    from ..workload.tokens import with_step_tokens

    opts = options_from(options, changes)
    check_output_folder(out)  # before exporting .nsys-rep reports and analyzing
    _check_detail_syntax(detail_steps)
    tokens = _read_tokens(lengths, verl_logs)
    files = resolve_traces(traces, reporter)
    with ExitStack() as stack:
        # started now, the drawing workers import matplotlib while the traces are read
        drawing = stack.enter_context(Drawing(draw_workers)) if figures else None
        reporter.begin(len(files))
        result = analyze(files, opts, progress=reporter.detail, on_file_done=reporter.file_done)
        for line in result.notes:
            reporter.note(line)
        with ExitStack() as on_error:
            on_error.callback(result.close)
            result = _invoked(with_step_tokens(result, tokens), command_line, top_kernels)
            if drawing is not None and detail_steps:
                from ..aggregate.step_stack import check_detail_steps

                check_detail_steps(result.steps, detail_steps)  # before anything is written
            written = _write_analysis(result, out, drawing, top_kernels, detail_steps, reporter)
            on_error.pop_all()
    return AnalysisOutputs(result, written)


def _write_analysis(
    result: Analysis,
    out: Path,
    drawing: Drawing | None,
    top_kernels: int | None,
    detail_steps: str | None,
    reporter: Reporter,
) -> list[Path]:
    """``analyze``'s tables, and its figures drawn meanwhile by ``drawing``, into ``out``."""
    from ..render.figures.tasks import phase_figure_tasks
    from ..render.outputs.files import output_folder, write_outputs

    reporter.stage("writing outputs")
    with output_folder(out) as session:  # afterwards out holds this run's files only
        if drawing is not None:
            for task in phase_figure_tasks(result, out / "figures", detail_steps=detail_steps):
                drawing.draw(task)
        draw = envelope_drawer(drawing, out / "figures")
        written = session.add(write_outputs(result, out, top_kernels=top_kernels, on_frame=draw))
        if drawing is not None:
            reporter.stage("drawing figures")
            written += session.add(drawing.drawn())
    return written


def build_report(
    inputs: Sequence[Path],
    out: Path,
    options: AnalyzeOptions | None = None,
    *,
    lengths: Path | None = None,
    cap: int | None = None,
    verl_logs: Sequence[Path] = (),
    command_line: Sequence[str] | None = None,
    detail_steps: str | None = None,
    draw_workers: int = 0,
    reporter: Reporter = QUIET,
    **changes: Any,
) -> list[Path]:
    """Write report.html and report.md (and the figures) of one run to ``out``: ``report``.

    ``inputs``: an analysis folder, or the run's traces (then their tables are written too,
    with ``command_line`` in the provenance). ``lengths``: response-length records (default:
    :func:`~analysis.jobs.lengths_dir.lengths_beside`) add length, straggler and
    tokens-and-energy sections (as ``verl_logs`` do); ``cap``: the rollout's max response
    length. ``options`` (or keywords): as :func:`analyze_to`'s; with an analysis folder only
    ``steps`` applies (the phase options are refused).
    """
    from ..options import options_from
    from ..render.figures.drawing import Drawing
    from ..render.figures.tasks import phase_figure_tasks
    from ..render.outputs.files import (
        check_output_folder,
        output_folder,
        same_folder,
        write_outputs,
    )
    from ..render.outputs.tables import TABLE_NAMES
    from ..render.report.document import write_report

    opts = options_from(options, changes)
    check_output_folder(out)  # before a long analysis, not after it
    _check_detail_syntax(detail_steps)
    folder = analysis_folder(inputs)
    if folder is not None:
        refuse_trace_options(folder, opts)  # before a long analysis
    tokens = _read_tokens(lengths, verl_logs)  # bad input fails before a long analysis
    with (
        Drawing(draw_workers) as drawing,  # its workers import matplotlib while the run is read
        open_run(inputs, opts, reporter=reporter) as result,
    ):
        if detail_steps:
            from ..aggregate.step_stack import check_detail_steps

            check_detail_steps(result.steps, detail_steps)  # before anything is written
        length_dir = lengths or lengths_beside(inputs, result)
        result = _with_tokens(result, tokens, length_dir, reporter)
        # out ends up holding this run's files only; an analysis drawn from out itself stays
        keep = TABLE_NAMES if folder is not None and same_folder(folder, out) else ()
        with output_folder(out, keep=keep) as session:
            for task in phase_figure_tasks(result, out / "figures", detail_steps=detail_steps):
                drawing.draw(task)
            if folder is None:
                for line in result.notes:
                    reporter.note(line)
                reporter.stage("writing outputs")
                draw = envelope_drawer(drawing, out / "figures")
                session.add(write_outputs(_invoked(result, command_line, 10), out, on_frame=draw))
            else:
                saved_envelope_figure(result, folder, out / "figures", drawing)
            sections = _run_sections(result, folder)
            if length_dir is not None:
                found, warned = length_sections(result, length_dir, cap, out / "figures", drawing)
                sections += found
                for line in warned:
                    reporter.note(f"warning: {line}")
                result = _with_warnings(result, warned)  # in the report's "Warnings"
            reporter.stage("drawing figures")
            figures = session.add(drawing.drawn())
            return session.add(write_report(result, out, figures, sections))


def _run_sections(result: Analysis, folder: Path | None) -> list[Section]:
    """The report's sections of the run itself, in order.

    An asynchronous run's pools first, then the kernels (saved in the analysis folder, else
    computed), memory, tokens and energy.
    """
    from ..render.report.kernels import kernel_sections
    from ..render.report.memory import memory_sections
    from ..render.report.pools import pool_sections
    from ..render.report.tokens import token_sections

    sections = pool_sections(result) + kernel_sections(result, folder)
    return sections + memory_sections(result) + token_sections(result)


def _read_tokens(lengths: Path | None, verl_logs: Sequence[Path]) -> StepTokens | None:
    """:func:`analysis.workload.tokens.read_step_tokens` (None when neither is given)."""
    from ..workload.tokens import read_step_tokens

    return read_step_tokens(lengths=lengths, verl_logs=verl_logs)


def _with_tokens(
    result: Analysis, tokens: StepTokens | None, length_dir: Path | None, reporter: Reporter
) -> Analysis:
    """``result`` with the report's tokens per step: those given, else the length records found.

    Without either, an analysis folder keeps its own ``step_tokens``. Their warnings are noted.
    """
    from ..workload.tokens import read_step_tokens, with_step_tokens

    if tokens is None and length_dir is not None:
        tokens = read_step_tokens(lengths=length_dir)
    before = len(result.warnings)
    result = with_step_tokens(result, tokens)
    for line in result.warnings[before:]:
        reporter.note(f"warning: {line}")
    return result


def _check_detail_syntax(detail_steps: str | None) -> None:
    """A malformed ``--detail-steps`` fails before a long analysis (its steps are checked after)."""
    from ..errors import InputError
    from ..step_spec import parse_steps

    if detail_steps:
        try:
            parse_steps(detail_steps)
        except InputError as exc:
            raise InputError(str(exc).replace("--steps", "--detail-steps", 1)) from exc


def compare_to(
    runs: Mapping[str, Path],
    out: Path,
    options: AnalyzeOptions | None = None,
    *,
    reporter: Reporter = QUIET,
    **changes: Any,
) -> list[Path]:
    """Compare labelled runs (analysis folders or traces) phase by phase into ``out``: ``compare``.

    ``options`` (or keywords): the phase options apply to runs given as traces (a note for each
    analysis folder); ``steps`` to every run (:mod:`analysis.run.select`). Writes
    :func:`analysis.render.outputs.compare_files.write_comparison`'s files, ``compare.md`` among them.
    """
    from ..options import options_from
    from ..render.outputs.compare_files import write_comparison

    opts = options_from(options, changes)  # a bad spec fails before any run is analyzed
    phase_options = opts.phase_map is not None or opts.all_ranges or opts.strip_args
    with ExitStack() as stack:
        analyses: dict[str, Analysis] = {}
        for label, run in runs.items():
            if is_analysis_folder(run) and phase_options:
                reporter.note(
                    f"{run} was analyzed already; --phase-map/--all-ranges/--strip-args not applied"
                )
            analyses[label] = stack.enter_context(
                open_run([run], opts, label=label, reporter=reporter)
            )
        reporter.stage("writing the comparison")
        return write_comparison(analyses, out)
