"""One caption per figure: what it shows and how to read it (used under each figure in the report)."""

from __future__ import annotations

FIGURE_CAPTIONS: dict[str, str] = {}


def caption_for(stem: str) -> str:
    """The caption of the figure saved as ``stem`` (.png/.svg), or "" when it has none yet."""
    return FIGURE_CAPTIONS.get(stem, "")
