"""The report's "device memory per phase" section, from ``memory_per_phase.csv``'s rows.

Per (scheme, phase path, GPU) over the steps: the highest peak, the median of the time-weighted
means, and the copies' D2H (offload) and H2D (onload) bytes summed. The table itself is
:func:`analysis.aggregate.memory.memory_per_phase`'s.
"""

from __future__ import annotations

import polars as pl

from ...model import Analysis
from .units import Section

SECTION_TITLE = "Device memory per phase (peak over the steps, median of the means; {basis})"
_BASIS = {
    "allocator_total": "PyTorch allocator's allocated bytes",
    "since_capture_start": "allocated − freed since the capture started",
    "mixed": "mixed: allocator totals and bytes since the capture started",
}


def memory_sections(analysis: Analysis) -> list[Section]:
    """The section (none when the run has no memory events: the notes say which table is missing)."""
    table = analysis.memory
    if table is None or table.is_empty():
        return []
    basis = "; ".join(_BASIS.get(b, b) for b in sorted(set(table["basis"].to_list())))
    frame = (
        table.group_by("attribution", "path", "device", maintain_order=True)
        .agg(
            pl.len().alias("n_rows"),
            pl.col("peak_bytes").max(),
            pl.col("mean_bytes").median(),
            pl.col("d2h_bytes").sum(),
            pl.col("h2d_bytes").sum(),
        )
        .sort("attribution", "path", "device")
    )
    return [(SECTION_TITLE.format(basis=basis), frame)]
