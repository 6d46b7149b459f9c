"""Jobs on one run: open it (an analysis folder or traces), analyze to a folder, report, compare."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..attribute.phase_map import PhaseMap
    from ..model import Analysis
    from ..render.drawing import Drawing
    from ..run.load import Engine

from ..errors import one_line
from .common import QUIET, Reporter
from .extras import envelope_files, gpu_metrics_files, length_sections
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
    """:func:`analysis.render.files.load_analysis`; a damaged file is a ``SavedAnalysisError``."""
    import polars as pl

    from ..errors import SavedAnalysisError
    from ..render.files import load_analysis

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
    steps: str | None = None,
    reporter: Reporter = QUIET,
) -> Analysis:
    """One run's :class:`~analysis.model.Analysis`, from its analysis folder or its traces.

    Traces are analyzed (stage "analyzing LABEL…" first) with ``phase_map``, ``idle_power_w``
    and ``force_combine``. ``steps``: a ``--steps`` spec (:mod:`analysis.run.select`), checked
    first. The caller closes the result (``with open_run(...) as run:``).
    """
    from ..run.pipeline import analyze
    from ..run.select import parse_steps, select_run

    spec = parse_steps(steps) if steps else None  # a bad spec fails before a long analysis
    folder = analysis_folder(inputs)
    if folder is not None:
        run = load_saved_analysis(folder)
    else:
        reporter.stage(f"analyzing {label}…" if label else "analyzing…")
        run = analyze(
            resolve_traces(inputs, reporter),
            phase_map=phase_map,
            idle_power_w=idle_power_w,
            progress=reporter.detail,
            force_combine=force_combine,
        )
    return run if spec is None else select_run(run, spec)


def _phase_map(
    path: Path | None, all_ranges: bool, strip_args: bool = False, folder: Path | None = None
) -> PhaseMap:  # an analysis folder keeps the options it was analyzed with: refused with one
    from ..attribute.phase_map import default_phase_map, load_phase_map
    from ..errors import InputError

    if folder is not None and (path is not None or all_ranges or strip_args):
        raise InputError(
            f"--phase-map/--all-ranges/--strip-args apply to traces only: {folder} is an analysis "
            "folder, analyzed with its own options (analyze again with them, or report the traces)"
        )
    pmap = load_phase_map(path) if path else default_phase_map()
    pmap = pmap.with_strip_args() if strip_args else pmap
    return pmap.with_all_ranges() if all_ranges else pmap


def _invoked(
    result: Analysis, command_line: Sequence[str] | None, phase_map: Path | None, top: int | None
) -> Analysis:
    """``result`` with the command line, the phase map file and ``top_kernels`` in provenance."""
    from ..run.provenance import with_invocation

    return with_invocation(
        result,
        command_line=command_line,
        options={"top_kernels": top},
        phase_map_file=phase_map,
    )


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
    top_kernels: int | None = 10,
    command_line: Sequence[str] | None = None,
    steps: str | None = None,
    strip_args: bool = False,
    detail_steps: str | None = None,
    draw_workers: int = 0,
    reporter: Reporter = QUIET,
) -> AnalysisOutputs:
    """Analyze one run's traces and write its tables (and figures) to ``out``: ``analyze``.

    ``out`` is checked before anything else, and afterwards holds this run's files only.
    ``phase_map``: a TOML file; ``all_ranges``: every NVTX range is a phase. ``top_kernels``:
    kernel names per phase in ``kernels_by_phase.csv`` (None or 0: all); ``command_line``: the
    CLI's, for the provenance in ``summary.json``. ``steps``: keep only these steps
    (:mod:`analysis.run.select`); ``strip_args``: cut PyTorch's argument suffixes off range
    names; ``detail_steps``: the steps of the power detail figure (same syntax; checked against
    the run's steps before anything is written); ``draw_workers``: processes drawing the figures
    meanwhile (0: here; see :mod:`analysis.render.drawing`). The other options are
    :func:`analysis.run.pipeline.analyze`'s (``chunk_ops`` None: its default).
    """
    from ..render.drawing import Drawing
    from ..render.files import check_output_folder
    from ..run.pipeline import analyze
    from ..run.select import parse_steps, select_run

    check_output_folder(out)  # before exporting .nsys-rep reports and analyzing
    spec = parse_steps(steps) if steps else None
    _check_detail_syntax(detail_steps)
    files = resolve_traces(traces, reporter)
    pmap = _phase_map(phase_map, all_ranges, strip_args)
    with ExitStack() as stack:
        # started now, the drawing workers import matplotlib while the traces are read
        drawing = stack.enter_context(Drawing(draw_workers)) if figures else None
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
            if spec is not None:
                result = select_run(result, spec)
            result = _invoked(result, command_line, phase_map, top_kernels)
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
    from ..render.figure_tasks import phase_figure_tasks
    from ..render.files import output_folder, write_outputs

    reporter.stage("writing outputs")
    with output_folder(out) as session:  # afterwards out holds this run's files only
        if drawing is not None:
            for task in phase_figure_tasks(result, out / "figures", detail_steps=detail_steps):
                drawing.draw(task)
        written = session.add(write_outputs(result, out, top_kernels=top_kernels))
        written += session.add(envelope_files(result, out, table=True, drawing=drawing))
        written += session.add(gpu_metrics_files(result, out, reporter))
        if drawing is not None:
            reporter.stage("drawing figures")
            written += session.add(drawing.drawn())
    return written


def build_report(
    inputs: Sequence[Path],
    out: Path,
    *,
    lengths: Path | None = None,
    cap: int | None = None,
    idle_power_w: float | None = None,
    force_combine: bool = False,
    command_line: Sequence[str] | None = None,
    steps: str | None = None,
    detail_steps: str | None = None,
    phase_map: Path | None = None,
    all_ranges: bool = False,
    strip_args: bool = False,
    draw_workers: int = 0,
    reporter: Reporter = QUIET,
) -> list[Path]:
    """Write report.html and report.md (and the figures) of one run to ``out``: ``report``.

    ``inputs``: an analysis folder, or the run's traces (then their tables are written too,
    with ``command_line`` in the provenance). ``lengths``: response-length records (default:
    :func:`~analysis.jobs.lengths_dir.lengths_beside`) add length, straggler and energy-per-token sections; ``cap``: the
    rollout's max response length; ``steps``: report only these steps. The others: as
    :func:`analyze_to`'s (phase_map, all_ranges, strip_args with an analysis folder: refused).
    """
    from ..render.drawing import Drawing
    from ..render.figure_tasks import phase_figure_tasks
    from ..render.files import (
        TABLE_NAMES,
        check_output_folder,
        output_folder,
        same_folder,
        write_outputs,
    )
    from ..render.kernels_by_phase import kernel_sections
    from ..render.report import write_report

    check_output_folder(out)  # before a long analysis, not after it
    _check_detail_syntax(detail_steps)
    folder = analysis_folder(inputs)
    pmap = _phase_map(phase_map, all_ranges, strip_args, folder)  # before a long analysis
    with (
        Drawing(draw_workers) as drawing,  # its workers import matplotlib while the run is read
        open_run(
            inputs,
            phase_map=pmap,
            idle_power_w=idle_power_w,
            force_combine=force_combine,
            steps=steps,
            reporter=reporter,
        ) as result,
    ):
        if detail_steps:
            from ..aggregate.step_stack import check_detail_steps

            check_detail_steps(result.steps, detail_steps)  # before anything is written
        # out ends up holding this run's files only; an analysis drawn from out itself stays
        keep = TABLE_NAMES if folder is not None and same_folder(folder, out) else ()
        with output_folder(out, keep=keep) as session:
            for task in phase_figure_tasks(result, out / "figures", detail_steps=detail_steps):
                drawing.draw(task)
            if folder is None:
                reporter.stage("writing outputs")
                session.add(write_outputs(_invoked(result, command_line, phase_map, 10), out))
                session.add(gpu_metrics_files(result, out, reporter))
            session.add(
                envelope_files(result, out, table=folder is None, drawing=drawing, saved=folder)
            )
            sections = kernel_sections(result, folder)  # saved in the folder, else computed
            length_dir = lengths or lengths_beside(inputs, result)
            if length_dir is not None:
                found, warned = length_sections(result, length_dir, cap, out / "figures", drawing)
                sections += found
                for line in warned:
                    reporter.note(f"warning: {line}")
                result = _with_warnings(result, warned)  # in the report's "Warnings"
            reporter.stage("drawing figures")
            figures = session.add(drawing.drawn())
            return session.add(write_report(result, out, figures, sections))


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
    *,
    phase_map: Path | None = None,
    all_ranges: bool = False,
    steps: str | None = None,
    strip_args: bool = False,
    reporter: Reporter = QUIET,
) -> list[Path]:
    """Compare labelled runs (analysis folders or traces) phase by phase into ``out``: ``compare``.

    ``phase_map``/``all_ranges``/``strip_args`` apply to runs given as traces (a note for each
    analysis folder); ``steps`` to every run (:mod:`analysis.run.select`). Writes
    :func:`analysis.render.compare_files.write_comparison`'s files, ``compare.md`` among them.
    """
    from ..render.compare_files import write_comparison
    from ..step_spec import parse_steps

    if steps:
        parse_steps(steps)  # a bad spec fails before any run is analyzed
    pmap = _phase_map(phase_map, all_ranges, strip_args)
    with ExitStack() as stack:
        analyses: dict[str, Analysis] = {}
        for label, run in runs.items():
            if is_analysis_folder(run) and (phase_map or all_ranges or strip_args):
                reporter.note(
                    f"{run} was analyzed already; --phase-map/--all-ranges/--strip-args not applied"
                )
            analyses[label] = stack.enter_context(
                open_run([run], label=label, phase_map=pmap, steps=steps, reporter=reporter)
            )
        reporter.stage("writing the comparison")
        return write_comparison(analyses, out)
