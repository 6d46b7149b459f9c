"""Read ahead in a background thread, so that SQLite and Parquet reads overlap Polars work.

SQLite (through ADBC), Arrow and Polars release the GIL while they work, so a reader thread
and the thread that consumes its frames run on two cores. Read-ahead is bounded: it never
holds more than ``depth`` items.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_DONE = object()


class Prefetched(Iterator[T]):
    """Items of ``produce()``, made in a background thread up to ``depth`` items ahead.

    Reading starts at once, before the first item is asked for. At most ``depth`` items are
    held ahead of the consumer, the one being made included. An exception in the producer
    is raised here, at the item where it happened. :meth:`close` (or leaving the ``with``
    block) stops the producer and waits for it, so that files it opened are closed.
    """

    def __init__(self, produce: Callable[[], Iterable[T]], depth: int = 2) -> None:
        self._items: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._finished = False
        self._worker = threading.Thread(
            target=self._run, args=(produce,), name="nvtx-phases-prefetch", daemon=True
        )
        self._worker.start()

    def _put(self, item: object) -> None:
        self._items.put(item)  # never blocks: at most depth items plus one end marker

    def _acquire(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=0.05):
                return True
        return False

    def _run(self, produce: Callable[[], Iterable[T]]) -> None:
        source = None
        try:
            source = iter(produce())
            # a slot before each item: at most depth items exist ahead of the consumer,
            # counting the one being made
            while self._acquire():
                try:
                    item = next(source)
                except StopIteration:
                    self._put((True, _DONE))
                    return
                self._put((True, item))
        except BaseException as exc:
            self._put((False, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        ok, item = self._items.get()
        self._slots.release()
        if not ok:
            self.close()
            raise item
        if item is _DONE:
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop reading ahead and wait for the reader thread to end."""
        self._finished = True
        self._stop.set()
        self._worker.join()

    def __enter__(self) -> Prefetched[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_threads(work: Callable[[T], R], inputs: Sequence[T], threads: int) -> list[R]:
    """``[work(x) for x in inputs]`` on up to ``threads`` threads, results in input order."""
    if threads <= 1 or len(inputs) <= 1:
        return [work(x) for x in inputs]
    with ThreadPoolExecutor(max_workers=min(threads, len(inputs))) as pool:
        return list(pool.map(work, inputs))
