"""A ``--steps`` value: which steps of a run a command looks at.

A spec is a comma-separated list of items, each a step ``N``, a range ``A:B`` that includes both
ends, or an open range ``A:`` (A and later) or ``:B`` (up to B); ``:`` is every step. Numbers are
the step indices of ``steps.csv`` and of the phase table's ``step`` column (VeRL numbers steps
from 1; ``step`` ranges without a payload are numbered from 0): labels, not positions, hence
inclusive ranges. ``2:3`` is steps 2 and 3; ``2:`` skips a warm-up step 1; ``1,3,7`` three steps.
Parsing only: :mod:`analysis.run.select` applies a spec to an analysis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import InputError

_ITEM = re.compile(r"^\s*(\d+)?\s*(:)?\s*(\d+)?\s*$")


@dataclass(frozen=True)
class StepSpec:
    """A parsed ``--steps`` value: inclusive ``(first, last)`` ranges, None for an open end."""

    text: str
    items: tuple[tuple[int | None, int | None], ...]

    def picks(self, steps: Iterable[int]) -> list[int]:
        """The steps among ``steps`` the spec selects, in increasing order."""
        return sorted(
            s
            for s in set(steps)
            if any((lo is None or s >= lo) and (hi is None or s <= hi) for lo, hi in self.items)
        )

    def named(self) -> list[int]:
        """The single steps the spec names (``N`` items)."""
        return [lo for lo, hi in self.items if lo is not None and lo == hi]


def parse_steps(text: str) -> StepSpec:
    """Parse a ``--steps`` value; a malformed one is a one-line :class:`InputError`."""
    items: list[tuple[int | None, int | None]] = []
    for part in text.split(","):
        match = _ITEM.match(part)
        if not part.strip() or match is None or (match[2] is None and match[3] is not None):
            raise InputError(
                f"--steps {text!r}: {part.strip()!r} is not a step N, an inclusive range A:B, "
                "an open range A: or :B, or a comma-separated list of them (e.g. 2:, 1,3,7)"
            )
        first = int(match[1]) if match[1] else None
        last = first if match[2] is None else (int(match[3]) if match[3] else None)
        if first is not None and last is not None and first > last:
            raise InputError(f"--steps {text!r}: range {part.strip()} ends before it starts")
        items.append((first, last))
    return StepSpec(text.strip(), tuple(items))


def steps_text(steps: list[int]) -> str:
    """Steps as a spec: consecutive runs as ``A:B`` (``1:3, 5``)."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}:{b}" for a, b in runs)
