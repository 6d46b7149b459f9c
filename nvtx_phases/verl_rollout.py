"""The ranges of VeRL 0.9.1's ``FullyAsyncRollouter``, driven by VeRL's own events.

VeRL tells the rollouter nothing when a weight sync starts (the trainer drives the rollout
servers through its ``CheckpointEngineManager``); the rollouter learns that a new parameter
version is in place when the trainer calls ``reset_staleness()`` after each sync. So, with VeRL's
own timers as the reference (``fully_async_rollouter.py``):

- ``version`` (payload = parameter version): from the end of one ``reset_staleness`` to the end
  of the next, the interval VeRL times as ``fully_async/rollouter/version_time`` (from its
  ``step_start_time``, set at the end of ``reset_staleness``). None opens once generation has
  ended; the last one ends when the rollouter's ``fit`` returns if no ``reset_staleness`` came.
  The first version is the trainer's when the rollouter starts (0, or the checkpoint's).
- inside it ``gen`` while the streaming loop generates, **including** the drain after VeRL's
  pause signal (the staleness limit or a full queue: ``paused``, ``_resume_event`` cleared):
  in-flight samples still generate then. ``staleness_wait`` from the drain's end, when VeRL sets
  ``idle_start_time`` and blocks until resumed, to the resume (``_resume_event`` set by
  ``reset_staleness`` or its monitor loop). VeRL's ``fully_async/rollouter/active_time`` is
  ``idle_start_time − step_start_time``: the version's start to its last ``staleness_wait``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nvtx_phases.marking import Span
from nvtx_phases.naming import VERSION

#: Attribute holding a rollouter's :class:`RolloutTimeline`.
TIMELINE_ATTR = "_nvtx_phases_timeline"
#: VeRL's attribute set when the drain after a pause has ended (:class:`IdleStartTime`).
IDLE_START = "idle_start_time"
GEN, STALENESS_WAIT = "gen", "staleness_wait"


class RolloutTimeline:
    """The rollouter's ``version`` ranges and their ``gen`` / ``staleness_wait`` children."""

    def __init__(self) -> None:
        self.first_version = 0
        self.version: int | None = None
        self.generating = False
        self.finished = False
        #: VeRL's ``paused`` (pause signal given; in-flight samples may still be generating)
        self.paused = False
        #: drained and blocked until resumed (VeRL's ``idle_start_time`` was set)
        self.idle = False
        #: inside ``reset_staleness``: its resume takes effect with the new version
        self.in_reset = False
        self._version: Span | None = None
        self._child: Span | None = None

    def version_installed(self) -> None:
        """``reset_staleness`` returned: the next version is in place (the first: the start's)."""
        self._close()
        if self.finished:
            return
        self.version = self.first_version if self.version is None else self.version + 1
        self._version = Span(VERSION, step=self.version)
        self._child_for_state()

    def generation_started(self) -> None:
        """The rollouter's streaming loop starts."""
        self.generating = True
        if self._version is None:
            self.version = self.first_version if self.version is None else self.version
            self._version = Span(VERSION, step=self.version)
        self._child_for_state()

    def generation_ended(self) -> None:
        """The streaming loop ended; the open version stays open until the next reset or ``fit``'s end."""
        self.generating = False
        self.finished = True
        self._child_for_state()

    def rollouter_stopped(self) -> None:
        """``fit`` returned: nothing of the rollouter's stays open."""
        self.generating = False
        self.finished = True
        self._close()

    def set_paused(self, paused: bool) -> None:
        """VeRL gave the pause signal (generation drains, then waits) or resumed generation."""
        self.paused = paused
        if not paused:
            self.idle = False
            if not self.in_reset:
                self._child_for_state()

    def idle_started(self) -> None:
        """VeRL set ``idle_start_time``: drained after the pause, now waiting to be resumed."""
        if self.paused and not self.in_reset:
            self.idle = True
            self._child_for_state()

    def _child_for_state(self) -> None:
        want = None
        if self.generating and self._version is not None:
            want = STALENESS_WAIT if self.idle else GEN
        if self._child is not None and self._child.name == want and self._child.open:
            return
        if self._child is not None:
            self._child.end()
            self._child = None
        if want is not None:
            self._child = Span(want, step=self.version, parent=self._version)

    def _close(self) -> None:
        if self._child is not None:
            self._child.end()
            self._child = None
        if self._version is not None:
            self._version.end()
            self._version = None


class PauseEvent(asyncio.Event):
    """VeRL's ``_resume_event`` (set: generating; cleared: paused) that tells the timeline."""

    def __init__(self, timeline: RolloutTimeline, is_set: bool) -> None:
        super().__init__()
        self._timeline = timeline
        if is_set:
            super().set()

    def set(self) -> None:
        """Resume: ``reset_staleness``, the monitor loop or ``fit``."""
        was_set = self.is_set()
        super().set()
        if not was_set:
            self._timeline.set_paused(False)

    def clear(self) -> None:
        """Pause: the staleness limit or a full queue."""
        was_set = self.is_set()
        super().clear()
        if was_set:
            self._timeline.set_paused(True)


class IdleStartTime:
    """A data descriptor for VeRL's ``idle_start_time`` that tells the timeline when it is set.

    The value stays in the instance's ``__dict__`` under its own name, so VeRL reads and
    writes it as before; a rollouter without a timeline is unaffected.
    """

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            return obj.__dict__[IDLE_START]
        except KeyError:
            raise AttributeError(IDLE_START) from None

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[IDLE_START] = value
        timeline = obj.__dict__.get(TIMELINE_ATTR)
        if isinstance(timeline, RolloutTimeline):
            timeline.idle_started()


def timeline_of(rollouter: Any) -> RolloutTimeline:
    """The rollouter's timeline (made on first use; its class's ``idle_start_time`` observed)."""
    timeline = getattr(rollouter, TIMELINE_ATTR, None)
    if not isinstance(timeline, RolloutTimeline):
        timeline = RolloutTimeline()
        setattr(rollouter, TIMELINE_ATTR, timeline)
        cls = type(rollouter)
        if not isinstance(cls.__dict__.get(IDLE_START), IdleStartTime):
            setattr(cls, IDLE_START, IdleStartTime())
    return timeline
