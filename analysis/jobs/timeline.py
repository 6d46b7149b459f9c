"""The ``timeline`` job: a run (analysis folder or traces) → one Chrome trace-event file.

:func:`~analysis.jobs.run.open_run` reads the run either way (a folder's GPU activity as a lazy
scan of its ``gpu_activity.parquet``). The events are built by :mod:`analysis.render.timeline.events`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from .common import QUIET, Reporter
from .run import analysis_folder, open_run

if TYPE_CHECKING:  # Polars and the analysis are imported where used: importing jobs is cheap
    from ..options import AnalyzeOptions

#: GPU operations shown one by one up to this many; past it, merged per stream into busy blocks
DEFAULT_MAX_OPS = 200_000
#: NVTX ranges drawn up to this many; past it, the shortest are left out (with their args, a
#: range's slice takes ~0.5 kB of JSON: the default keeps the file within what ui.perfetto.dev
#: loads comfortably, beside DEFAULT_MAX_OPS operations)
DEFAULT_MAX_RANGES = 300_000


@dataclass(frozen=True)
class TimelineOutputs:
    """What :func:`timeline_to` wrote, and what the user should know about it."""

    path: Path
    size_bytes: int
    n_events: int
    #: NVTX ranges of the run (None: an analysis folder without ranges.parquet), and drawn
    n_ranges: int | None
    n_ranges_drawn: int
    n_gpu_ops: int
    n_power_samples: int
    #: what was thinned (ranges left out, operations merged) or is not available
    notes: list[str]


def check_output_file(out: Path) -> None:
    """Fail early, in one line, when ``out`` cannot be written as a file (before analyzing)."""
    if out.is_dir():
        raise OutputError(f"--out {out}: is a folder; give a file name such as trace.json.gz")
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"--out {out}: cannot create it ({existing} is not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out}: cannot create it ({existing} is not writable)")


def timeline_to(
    inputs: Sequence[Path],
    out: Path,
    options: AnalyzeOptions | None = None,
    *,
    max_ops: int = DEFAULT_MAX_OPS,
    max_ranges: int = DEFAULT_MAX_RANGES,
    merge_gap_us: float | None = None,
    reporter: Reporter = QUIET,
    **changes: Any,
) -> TimelineOutputs:
    """Write one run's timeline to ``out`` (gzipped when it ends in ``.gz``): ``timeline``.

    One slice per NVTX range; past ``max_ranges`` ranges the shortest are left out. Past
    ``max_ops`` GPU operations, each stream's are merged into busy blocks; ``merge_gap_us``
    merges operations less than that apart whatever their number. ``options`` (or keywords,
    :class:`~analysis.options.AnalyzeOptions`) apply to traces, except ``steps`` (those steps'
    phases and operations), which applies to an analysis folder too (the others: a note).
    """
    from ..options import options_from
    from ..render.timeline.events import build_timeline, write_timeline

    opts = options_from(options, changes)  # a bad spec or map fails before any reading
    check_output_file(out)
    folder = analysis_folder(inputs)
    if folder is not None and (opts.phase_map is not None or opts.all_ranges or opts.strip_args):
        reporter.note(
            f"{folder} was analyzed already; --phase-map/--all-ranges/--strip-args not applied"
        )
    gap_ns = None if merge_gap_us is None else round(merge_gap_us * 1000)
    with open_run(inputs, opts, reporter=reporter) as full:
        reporter.stage("building the timeline")
        timeline = build_timeline(full, max_ops=max_ops, merge_gap_ns=gap_ns, max_ranges=max_ranges)
        reporter.stage(f"writing {out}")
        try:
            path = write_timeline(timeline, out)
        except OSError as exc:  # the temporary name is ours: name the file the user gave
            raise OutputError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    other = timeline.other_data
    return TimelineOutputs(
        path=path,
        size_bytes=path.stat().st_size,
        n_events=timeline.n_events,
        n_ranges=other["n_ranges"],
        n_ranges_drawn=other.get("n_ranges_drawn", 0),
        n_gpu_ops=other["n_gpu_ops"],
        n_power_samples=other["n_power_samples"],
        notes=timeline.notes,
    )
