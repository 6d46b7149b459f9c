"""Figures drawn in background processes, started before their tables exist.

One figure (matplotlib Agg: a 200 dpi PNG and an SVG, its numbers in a CSV beside them) costs
0.15–0.3 s of one core, most of it rasterizing, and importing matplotlib another 0.35 s; a run
has 4 to 12 figures. A
:class:`Drawing` starts its worker processes at once, so that they import matplotlib while the
trace is read; it takes figure tasks when their tables are ready and draws them side by side
while the caller writes its tables. The caller never imports matplotlib.

Workers are forked from a fork server (spawned where there is none), never from this process:
a fork after Polars has started its thread pool can deadlock the child. A task names its
function (``"module:function"``) and carries only aggregated tables (a few MB at most, the
power samples aside), so sending it costs little.

With one core, or ``NVTX_PHASES_DRAW_WORKERS=0``, figures are drawn in this process instead.
Library calls draw here unless given workers: a spawned process imports the caller's main
module, which must then be guarded by ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import importlib
import os
import queue
import threading
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from types import TracebackType
from typing import Any

#: The modules a worker imports as it starts (matplotlib, Polars, NumPy come with them).
WARM_MODULES = (
    "nvtx_phases.analysis.render.figures.phases",
    "nvtx_phases.analysis.render.figures.power",
    "nvtx_phases.analysis.render.figures.envelope",
    "nvtx_phases.analysis.render.figures.lengths",
)
#: Workers at most: more would spend their start-up importing for figures that are few.
MAX_WORKERS = 4
WORKERS_ENV = "NVTX_PHASES_DRAW_WORKERS"


@dataclass(frozen=True)
class FigureTask:
    """One call that draws figures: ``target`` is ``"module:function"``; it returns the paths."""

    target: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> list[Path]:
        """Import the function and draw (in whichever process this runs)."""
        module, name = self.target.split(":")
        return list(getattr(importlib.import_module(module), name)(*self.args, **self.kwargs))


def default_workers() -> int:
    """Worker processes for this machine: none on one core, else up to :data:`MAX_WORKERS`.

    ``NVTX_PHASES_DRAW_WORKERS`` overrides it (0: draw in this process).
    """
    value = os.environ.get(WORKERS_ENV, "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            pass  # a malformed override: the default, rather than failing a long analysis
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 0 if (cores or 1) < 2 else min(MAX_WORKERS, cores or 1)


def _context() -> BaseContext:
    """A fork server that imported the drawing modules once (else spawn, where there is none).

    Workers forked from it start drawing in milliseconds; the server's one import overlaps the
    reading of the trace and takes one core, not one per worker.
    """
    if "forkserver" not in get_all_start_methods():
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload(list(WARM_MODULES))
    return context


def _warm() -> None:
    for module in WARM_MODULES:
        importlib.import_module(module)


class Drawing:
    """Figure tasks run by worker processes started now (or in this process: ``workers=0``).

    Use as a context manager: leaving it stops the workers, at once after an error.
    :meth:`draw` never waits for the workers to start; :meth:`drawn` waits for every task and
    returns their files in the order the tasks were given.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Pool | None = None
        self._drawn: list[list[Path]] = []  # drawn here (no workers)
        self._tasks: queue.Queue[FigureTask | None] = queue.Queue()
        self._results: list[AsyncResult[list[Path]]] = []
        self._here: list[FigureTask] = []  # given to workers that could not start
        self._feeder: threading.Thread | None = None
        if workers:
            # a thread starts the pool (a fork server answers only once it has imported the
            # drawing modules) and hands it the tasks as they come
            self._feeder = threading.Thread(target=self._feed, name="nvtx-phases-drawing")
            self._feeder.start()

    def _feed(self) -> None:
        try:
            self._pool = _context().Pool(self.workers, initializer=_warm)
        except Exception:  # no processes to be had (limits, a sandbox): drawn here instead
            self._pool = None
        while (task := self._tasks.get()) is not None:
            if self._pool is None:
                self._here.append(task)
            else:
                self._results.append(self._pool.apply_async(task))

    def draw(self, task: FigureTask) -> None:
        """Start drawing ``task`` (in this process, at once, without workers)."""
        if self._feeder is None:
            self._drawn.append(task())
        else:
            self._tasks.put(task)

    def _fed(self) -> None:
        """Wait until every task given so far is with the workers."""
        if self._feeder is not None:
            self._tasks.put(None)
            self._feeder.join()
            self._feeder = None

    def drawn(self) -> list[Path]:
        """Every task's files, in the order given; a task's error is raised here."""
        self._fed()
        paths = [path for files in self._drawn for path in files]
        paths += [path for result in self._results for path in result.get()]
        paths += [path for task in self._here for path in task()]
        self._drawn, self._results, self._here = [], [], []
        return paths

    def close(self, *, wait: bool = True) -> None:
        """Stop the workers (``wait``: after the tasks given; else at once)."""
        self._fed()
        if self._pool is None:
            return
        if wait:
            self._pool.close()
        else:
            self._pool.terminate()
        self._pool.join()
        self._pool = None

    def __enter__(self) -> Drawing:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(wait=exc_type is None)
