"""Mark steps, phases and subphases as NVTX ranges: ``with phase("gen"):`` or ``@phase("gen")``.

Ranges go to the NVTX domain :data:`~nvtx_phases.naming.DOMAIN` with one color per phase, and
carry the step index as their int64 payload, so the analysis needs no name parsing. A phase
opened inside ``with step(s):`` inherits ``s``. Without a profiler attached, NVTX calls are
no-ops, so marking costs next to nothing.

Older ``nvtx`` releases (< 0.2.9, the ones that record ranges under nsys 2022.4) cannot send a
payload; in this package's domain the step index then travels as the NVTX *category* (a uint32
that nsys records; 0 means none), and the analysis reads it from there (see
:data:`PAYLOAD_SUPPORTED`). Decorated ``async`` functions get start/end ranges, since coroutines
interleave on one thread and would break push/pop nesting.

The same ranges can be written to a JSON-lines file with monotonic and wall-clock stamps
(:func:`record_to`, or the ``NVTX_PHASES_JSONL`` environment variable in every process), for
cheap timing without a profiler and as a cross-check of the nsys data.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import nvtx

from nvtx_phases.naming import DOMAIN, PATH_SEP, STEP, phase_color

F = TypeVar("F", bound=Callable[..., Any])

#: Whether the installed ``nvtx`` can attach a payload (the step index) to a range.
PAYLOAD_SUPPORTED = "payload" in inspect.signature(nvtx.push_range).parameters
#: Environment variable naming a JSON-lines file every process appends its ranges to.
JSONL_ENV = "NVTX_PHASES_JSONL"

#: Open ranges of the current thread or asyncio task: ((name, step), ...). A ContextVar, not a
#: thread-local, so that interleaved coroutines each see their own nesting.
_OPEN: ContextVar[tuple[tuple[str, int | None], ...]] = ContextVar("nvtx_phases_open", default=())


class JsonlRecorder:
    """Appends one JSON object per closed range to a file (thread- and process-safe lines)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # O_APPEND: each line is one write(), so lines of concurrent processes never interleave
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a line."""
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


_recorder: JsonlRecorder | None = None
_recorder_lock = threading.Lock()


def _active_recorder() -> JsonlRecorder | None:
    global _recorder
    if _recorder is None and os.environ.get(JSONL_ENV):
        with _recorder_lock:
            if _recorder is None:
                _recorder = JsonlRecorder(os.environ[JSONL_ENV])
    return _recorder


@contextmanager
def record_to(path: str | Path) -> Iterator[JsonlRecorder]:
    """Write every range closed inside this block (any thread) to ``path`` as JSON lines."""
    global _recorder
    recorder = JsonlRecorder(path)
    with _recorder_lock:
        previous, _recorder = _recorder, recorder
    try:
        yield recorder
    finally:
        with _recorder_lock:
            _recorder = previous
        recorder.close()


def current_step() -> int | None:
    """The step index of the innermost open range (this thread or task) that has one."""
    for _, step_index in reversed(_OPEN.get()):
        if step_index is not None:
            return step_index
    return None


class phase:
    """An NVTX range for one phase (context manager or decorator).

    Args:
        name: phase name (``gen``, ``update_actor``, a subphase such as ``weight_sync``).
        step: step index sent as the range's payload; by default the enclosing step's.
        domain: NVTX domain (default: the nvtx_phases domain).

    """

    def __init__(
        self,
        name: str,
        *,
        step: int | None = None,
        domain: str = DOMAIN,
        asynchronous: bool = False,
    ) -> None:
        self.name = name
        self.step = step
        self.domain = domain
        self.asynchronous = asynchronous
        self._frames: list[tuple[int, int, str, Any, Any, int | None]] = []

    def __enter__(self) -> phase:
        step_index = self.step if self.step is not None else current_step()
        open_ranges = _OPEN.get()
        path = PATH_SEP.join([*(n for n, _ in open_ranges), self.name])
        token = _OPEN.set((*open_ranges, (self.name, step_index)))
        kwargs = nvtx_attributes(self.name, step_index, self.domain)
        if self.asynchronous:
            handle = nvtx.start_range(self.name, **kwargs)
        else:
            handle = None
            nvtx.push_range(self.name, **kwargs)
        self._frames.append((time.monotonic_ns(), time.time_ns(), path, handle, token, step_index))
        return self

    def __exit__(self, *exc: object) -> None:
        end_mono = time.monotonic_ns()
        start_mono, start_wall, path, handle, token, step_index = self._frames.pop()
        if handle is not None:
            nvtx.end_range(handle)
        else:
            nvtx.pop_range(domain=self.domain)
        _OPEN.reset(token)
        recorder = _active_recorder()
        if recorder is not None:
            recorder.write(
                {
                    "name": self.name,
                    "path": path,
                    "step": step_index,
                    "domain": self.domain,
                    "pid": os.getpid(),
                    "tid": threading.get_native_id(),
                    "start_mono_ns": start_mono,
                    "end_mono_ns": end_mono,
                    "start_wall_ns": start_wall,
                    "dur_ns": end_mono - start_mono,
                }
            )

    def __call__(self, func: F) -> F:
        """Use as a decorator: every call of ``func`` runs inside the range.

        ``functools.wraps`` keeps ``func``'s attributes, so frameworks that tag methods (VeRL's
        ``@register``) still find their tags on the wrapper.
        """
        name, step_index, domain = self.name, self.step, self.domain
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with phase(name, step=step_index, domain=domain, asynchronous=True):
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name, step=step_index, domain=domain):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def nvtx_attributes(name: str, step_index: int | None, domain: str) -> dict[str, Any]:
    """Keyword arguments for ``nvtx`` range calls: color, domain and the step index.

    The step goes in the payload where ``nvtx`` supports one, else (this package's domain
    only, values 1 … 2**32-1) in the category.
    """
    kwargs: dict[str, Any] = {"color": phase_color(name), "domain": domain}
    if step_index is not None:
        if PAYLOAD_SUPPORTED:
            kwargs["payload"] = int(step_index)
        elif domain == DOMAIN and 0 < step_index < 2**32:
            kwargs["category"] = int(step_index)
    return kwargs


def step(index: int, *, domain: str = DOMAIN) -> phase:
    """The range of training step ``index``; phases opened inside inherit the index."""
    return phase(STEP, step=index, domain=domain)


class Span:
    """A start/end range opened by one call and closed by another (a state machine's, not a block's).

    For a range whose start and end are events of a long-running coroutine (a pause begins in
    one method, ends in another), where ``with phase(...)`` cannot be used: its context
    variable would be reset in another context. ``parent`` only names the JSON-lines path.
    Ending twice is a no-op.
    """

    def __init__(
        self,
        name: str,
        *,
        step: int | None = None,
        domain: str = DOMAIN,
        parent: Span | None = None,
    ) -> None:
        self.name = name
        self.step = step
        self.domain = domain
        self.path: str = PATH_SEP.join([parent.path, name]) if parent is not None else name
        self._handle: Any = nvtx.start_range(name, **nvtx_attributes(name, step, domain))
        self._start_mono = time.monotonic_ns()
        self._start_wall = time.time_ns()
        self.open = True

    def end(self) -> None:
        """Close the range (and record it, when recording)."""
        if not self.open:
            return
        self.open = False
        end_mono = time.monotonic_ns()
        nvtx.end_range(self._handle)
        recorder = _active_recorder()
        if recorder is not None:
            recorder.write(
                {
                    "name": self.name,
                    "path": self.path,
                    "step": self.step,
                    "domain": self.domain,
                    "pid": os.getpid(),
                    "tid": threading.get_native_id(),
                    "start_mono_ns": self._start_mono,
                    "end_mono_ns": end_mono,
                    "start_wall_ns": self._start_wall,
                    "dur_ns": end_mono - self._start_mono,
                }
            )
