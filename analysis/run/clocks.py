"""Put several export files on one clock.

``TARGET_INFO_SESSION_START_TIME`` states each session's start as UTC epoch ns, read from the
capturing host's system clock. Exports up to nsys 2024/2025 count timestamps from that start;
newer ones (seen in 2026.2) stamp events with the host's own clock and add ``systemClockNs``, the
session start on that clock. So a file's clock zero is ``utcEpochNs − systemClockNs`` (0 when the
column is absent), and shifting every file by its zero minus the earliest zero puts all files on
the earliest file's clock.

Accuracy: files captured on one host share its clock, so they line up to within nsys's own
conversion (microseconds). Files from different hosts line up only as well as those hosts'
clocks agree (NTP: typically 0.1–10 ms; PTP: microseconds). Phases shorter than that skew
should not be compared across hosts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from ..errors import CombineError

#: Gap between capture windows still read as one run: the clock disagreement between hosts this
#: alignment allows for (NTP: up to ~10 ms). Two separate nsys captures lie seconds apart at the
#: least (nsys's own start-up), so a gap this small is no evidence of two runs.
WINDOW_SLACK_NS = 10_000_000
#: The command-line option that combines files :func:`check_combinable` refuses.
FORCE_OPTION = "--force-combine"


class _Session(Protocol):
    label: str
    host: str
    #: UTC ns of the file's clock zero (None: unknown)
    clock_zero_utc_ns: int | None


class Capture(Protocol):
    """What :func:`check_combinable` needs of a file (:class:`analysis.run.load.LoadedTrace`)."""

    path: Path
    label: str
    host: str
    #: UTC ns of the session start (``TARGET_INFO_SESSION_START_TIME``); None when absent
    session_start_utc_ns: int | None
    #: ``ANALYSIS_DETAILS.duration``: how long the capture ran (ns); None when absent
    duration_ns: int | None
    #: processes with any NVTX range or GPU operation
    pids: list[int]


def clock_offsets(traces: Sequence[_Session]) -> tuple[dict[str, int], list[str]]:
    """Offset (ns) to add to each trace's timestamps, keyed by trace label, and warnings."""
    warnings: list[str] = []
    starts = {t.label: t.clock_zero_utc_ns for t in traces}
    known = [s for s in starts.values() if s is not None]
    if len(traces) > 1 and len(known) < len(traces):
        missing = sorted(label for label, s in starts.items() if s is None)
        warnings.append(
            f"no session start time in {', '.join(missing)}: those files are NOT aligned "
            "with the others (offset 0); cross-file phase attribution may be wrong"
        )
    origin = min(known) if known else 0
    offsets = {label: (s - origin if s is not None else 0) for label, s in starts.items()}
    hosts = {t.host for t in traces if t.host}
    if len(hosts) > 1:
        warnings.append(
            f"files come from {len(hosts)} hosts ({', '.join(sorted(hosts))}); their clocks "
            "agree only as well as the hosts' clock sync (NTP: ~ms)"
        )
    return offsets, warnings


def check_combinable(traces: Sequence[Capture], *, force: bool) -> list[str]:
    """Refuse files that are not one run; return warnings (one per problem when ``force``).

    A file's capture window is ``[session start, session start + duration]`` in UTC (the start
    from TARGET_INFO_SESSION_START_TIME, the duration from ANALYSIS_DETAILS): on the run's clock,
    ``[offset, offset + duration]``. It is taken in UTC, not from the clock offsets, so that it
    does not depend on where a file's timestamps count from (session start in older exports;
    the host's clock, ``systemClockNs`` at the session start, in recent ones). Two rules:

    - **windows**: the files' windows must form one stretch of time, each file overlapping
      another (gaps up to :data:`WINDOW_SLACK_NS`, the clock skew allowed between hosts). A
      chain is enough: a driver spanning the run and workers that came and went are one run;
      two captures an hour apart are not.
    - **processes**: a process (host, pid) may appear in two files only at different times.
      Session starts cannot tell sessions apart: one nsys session writes one report per process
      with starts milliseconds apart, and two runs can share a start (the synthetic samples
      do). Time can: one process is never captured by two nsys sessions at once, so the same
      (host, pid) in two files whose windows overlap is the same capture given twice, or two
      runs that reuse the pid; combining either counts its GPU work twice. The same (host, pid)
      at different times (a pid reused later, one process captured in several ranges) is left
      to the windows rule.

    Every problem goes into one line, the windows rule's first. Raises :class:`AnalysisError`
    unless ``force``; with ``force`` each problem is a warning. A file without a session start
    or a duration cannot be checked: a warning. Files from machines that share a host name and
    reuse pids (containers) look like one process captured twice: ``force`` combines them.
    """
    if len(traces) < 2:
        return []
    warnings: list[str] = []
    unknown = [t for t in traces if t.session_start_utc_ns is None or t.duration_ns is None]
    if unknown:
        warnings.append(
            f"{_names(unknown)}: no session start time or capture duration (ANALYSIS_DETAILS): "
            "cannot check that they belong to the same run as the other files"
        )
    windows: dict[str, tuple[int, int]] = {}
    for trace in traces:
        start, duration = trace.session_start_utc_ns, trace.duration_ns
        if start is not None and duration is not None:
            windows[trace.label] = (start, start + duration)
    # by start; files starting together in the order given
    known = sorted((t for t in traces if t.label in windows), key=lambda t: windows[t.label][0])
    problems = _window_problems(known, windows) + _process_problems(known, windows)
    if not problems:
        return warnings
    if not force:
        raise CombineError(
            f"files of different runs: {'; '.join(problems)}; "
            f"pass {FORCE_OPTION} to combine them anyway"
        )
    return [*warnings, *(f"combined anyway ({FORCE_OPTION}): {p}" for p in problems)]


def _window_problems(
    traces: Sequence[Capture], windows: Mapping[str, tuple[int, int]]
) -> list[str]:
    """One problem when the windows (``traces`` sorted by start) form several stretches."""
    groups: list[list[Capture]] = []
    reach = 0
    for trace in traces:
        start, end = windows[trace.label]
        if groups and start - reach <= WINDOW_SLACK_NS:
            groups[-1].append(trace)
            reach = max(reach, end)
        else:
            groups.append([trace])
            reach = end
    if len(groups) < 2:
        return []
    parts: list[str] = []
    previous_end: int | None = None
    for group in groups:
        first, last = windows[group[0].label][0], max(windows[t.label][1] for t in group)
        described = f"{_names(group)} ({_utc(first)}, lasting {_span(last - first)})"
        if previous_end is not None:
            described = f"{_span(first - previous_end)} later {described}"
        parts.append(described)
        previous_end = last
    return ["capture windows do not overlap: " + ", then ".join(parts)]


def _process_problems(
    traces: Sequence[Capture], windows: Mapping[str, tuple[int, int]]
) -> list[str]:
    """Pairs of files (``traces`` sorted by start) that hold one (host, pid) at the same time."""
    holders: dict[tuple[str, int], list[Capture]] = {}
    for trace in traces:
        for pid in trace.pids:
            holders.setdefault((trace.host, pid), []).append(trace)
    shared: dict[tuple[int, int], list[int]] = {}  # (index of a, index of b) -> pids
    index = {t.label: i for i, t in enumerate(traces)}
    for (_, pid), files in holders.items():
        for i, a in enumerate(files):
            for b in files[i + 1 :]:
                (a0, a1), (b0, b1) = windows[a.label], windows[b.label]
                if min(a1, b1) > max(a0, b0):
                    shared.setdefault((index[a.label], index[b.label]), []).append(pid)
    problems = []
    for (i, j), pids in sorted(shared.items()):
        a, b = traces[i], traces[j]
        listed = ", ".join(str(p) for p in sorted(pids)[:5])
        if len(pids) > 5:
            listed += f" and {len(pids) - 5} more"
        host = f"host {a.host}" if a.host else "an unnamed host"
        problems.append(
            f"{a.path} and {b.path} both hold process(es) {listed} of {host} at the same time "
            "(the same capture given twice, or two runs that reuse these pids)"
        )
    return problems


def _names(traces: Sequence[Capture]) -> str:
    names = [str(t.path) for t in traces]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _span(ns: int) -> str:
    """A duration in the unit that reads best: ms, s, min or h."""
    seconds = ns / 1e9
    if seconds < 1:
        return f"{ns / 1e6:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
