"""What every job shares: the :class:`Reporter` it tells its progress to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _quiet(_message: object) -> None:
    """Say nothing."""


@dataclass(frozen=True)
class Reporter:
    """Where a job tells what it is doing; every callback defaults to saying nothing."""

    #: a line worth keeping: an export made, an option not applied, a feature skipped
    note: Callable[[str], None] = _quiet
    #: a step of the job begins: "analyzing NAME…", "writing outputs", "drawing figures"
    stage: Callable[[str], None] = _quiet
    #: what the analysis pipeline is doing within a step (many short messages)
    detail: Callable[[str], None] = _quiet
    #: reading begins: this many exports
    begin: Callable[[int], None] = _quiet
    #: one export read (its label)
    file_done: Callable[[str], None] = _quiet


#: the reporter that says nothing
QUIET = Reporter()
