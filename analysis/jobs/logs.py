"""The ``logs`` job: phase tables, per-step metrics and the share figure from VeRL logs alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .common import QUIET, Reporter

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class LogsOutputs:
    """What :func:`logs_to` made: the tables, the table's title and the files written."""

    #: ``step, phase, seconds, source`` (``phase_times.csv``)
    phase_times: pl.DataFrame
    #: one row per step, every other metric as logged (``steps.csv``)
    steps: pl.DataFrame
    #: per phase, then other and step: n_steps, median_s, p10_s, p90_s and the share of step's
    #: median and p10–p90 over steps (share_median_pct, share_p10_pct, share_p90_pct)
    summary: pl.DataFrame
    #: ``VeRL phase times: N steps (first–last)``
    title: str
    written: list[Path]


def _step_list(steps: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, steps[:most]))
    return shown + (f", … ({len(steps)} steps)" if len(steps) > most else "")


def summed_note(steps: list[int]) -> str:
    """Why ``steps`` have the sum of their phases as their time (no step timer logged)."""
    from ..workload.verl_logs import SUMMED

    return (
        f"no step timer (timing_s/step) in steps {_step_list(steps)} (VeRL 0.1 logs none): "
        f"their step time is the sum of their stage timers (source '{SUMMED}' in "
        "phase_times.csv), so the time between stages is not seen"
    )


def logs_to(
    paths: Sequence[Path], out: Path, *, max_bars: int = 40, reporter: Reporter = QUIET
) -> LogsOutputs:
    """Read VeRL console or JSON-lines logs (run segments, in order) and write into ``out``.

    ``phase_times.csv`` (``step, phase, seconds, source``; every step has a ``step`` row),
    ``steps.csv``, ``phase_summary.csv``, ``phase_summary.md`` and
    ``figures/phase_share.{png,svg}`` (at most ``max_bars`` bars). A step logged again keeps the
    last file's values (noted); a log without step timers is a ``WorkloadInputError``.
    """
    from ..render.outputs.files import check_output_folder, output_folder
    from ..render.report import verl_logs as render
    from ..workload import verl_logs as wl
    from ..workload.verl_memory import memory_per_step

    check_output_folder(out)
    reporter.stage(f"reading {len(paths)} VeRL log(s)")
    log = wl.read_logs(paths)
    repeated = wl.repeated_steps(log)
    if repeated:
        reporter.note(
            f"steps logged more than once (a resumed run?): {_step_list(repeated)}; "
            "each keeps the values of the last file that logged it"
        )
    values = wl.latest_values(log)
    times = wl.phase_times(values)
    summed = wl.summed_steps(times)
    if summed:
        reporter.note(summed_note(summed))
    over = wl.overtimed_steps(times)
    if over:
        reporter.note(
            f"phase timers add up to more than timing_s/step in steps {_step_list(over)} "
            "(nested or overlapping timers?): their other (not timed) is 0"
        )
    steps = wl.steps_table(values, times)
    memory, memory_notes = memory_per_step(values)
    for note in memory_notes:
        reporter.note(note)
    summary = wl.phase_summary(times)
    shares, bars = render.share_bars(times, max_bars=max_bars)
    title = render.summary_title(times)
    with output_folder(out) as session:
        render.write_csv_tables(session, times, steps, summary)
        if memory.height:
            session.write("memory_per_step.csv", memory.write_csv)
        markdown = render.summary_markdown(summary, title, summed_note(summed) if summed else None)
        session.write("phase_summary.md", lambda p: p.write_text(markdown, encoding="utf-8"))
        session.add(render.phase_share_figure(shares, bars, out / "figures"))
    return LogsOutputs(
        phase_times=times, steps=steps, summary=summary, title=title, written=session.written
    )
