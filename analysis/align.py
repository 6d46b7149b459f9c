"""Put several export files on one clock.

Each export's timestamps count from its own session start; ``TARGET_INFO_SESSION_START_TIME``
states that start as UTC epoch ns, read from the capturing host's system clock. Shifting every
file by its start minus the earliest start puts all files on the earliest file's clock.

Accuracy: files captured on one host share its clock, so they line up to within nsys's own
conversion (microseconds). Files from different hosts line up only as well as those hosts'
clocks agree (NTP: typically 0.1–10 ms; PTP: microseconds). Phases shorter than that skew
should not be compared across hosts.
"""

from __future__ import annotations

from typing import Protocol


class _Session(Protocol):
    label: str
    host: str
    session_start_utc_ns: int | None


def clock_offsets(traces: list[_Session]) -> tuple[dict[str, int], list[str]]:
    """Offset (ns) to add to each trace's timestamps, keyed by trace label, and warnings."""
    warnings: list[str] = []
    starts = {t.label: t.session_start_utc_ns for t in traces}
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
