"""The per-operation activity of a bucketed run, written to one Parquet file a bucket at a time."""

from __future__ import annotations

import importlib
import queue
import threading
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import OutputError

#: the per-operation rows of a bucketed run, in its work folder's ``activity/``
ACTIVITY_FILE = "activity.parquet"


class ActivityWriter:
    """One Parquet file written a frame at a time (a row group each), lz4 like the spill parts.

    Polars writes a file in one call; pyarrow's writer appends. The writing runs on a thread of
    its own (pyarrow releases the GIL), so the next bucket is attributed while this one is
    encoded: at 10M operations the writes took 2.7 s of the main thread. One frame at a time is
    with the thread (see :meth:`write`). Imported only here: runs that fit one bucket never need
    it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._frames: queue.Queue[pl.DataFrame | None] = queue.Queue(maxsize=1)
        self._error: Exception | None = None
        self._pq: Any = None  # pyarrow.parquet, imported by the thread
        # a daemon: a run that fails before close() must not hang the interpreter at exit
        self._thread = threading.Thread(target=self._run, name="nvtx-phases-activity", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        writer: Any = None
        try:
            self._pq = importlib.import_module("pyarrow.parquet")
        except Exception as exc:  # the thread must keep draining, or write() would wait forever
            self._error = exc
        try:
            while (frame := self._frames.get()) is not None:
                try:
                    if self._error is None:  # else drain: the caller learns of it next call
                        writer = self._append(writer, frame)
                finally:
                    del frame  # not held while waiting for the next one
                    self._frames.task_done()
        finally:
            if writer is not None:
                writer.close()

    def _append(self, writer: Any, frame: pl.DataFrame) -> Any:
        table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())  # any pyarrow >= 14
        try:
            if writer is None:
                writer = self._pq.ParquetWriter(self.path, table.schema, compression="lz4")
            writer.write_table(table, row_group_size=65_536)
        except OSError as exc:
            self._error = OutputError(
                f"spill folder {self.path.parent}: cannot write {self.path.name} "
                f"({exc}); free space there or pass --spill-dir elsewhere"
            )
        except Exception as exc:  # raised in the caller's thread, never lost
            self._error = exc
        return writer

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, frame: pl.DataFrame) -> None:
        """Append ``frame`` (same columns and types every time).

        Returns once the previous frame is written and this one handed over: one frame in
        flight, so memory holds at most two buckets' rows (this one, the caller's next).
        """
        self._frames.join()
        self._raise()
        self._frames.put(frame)

    def close(self) -> None:
        """Finish the file, raising a write's error (idempotent)."""
        if self._thread.is_alive():
            self._frames.put(None)
            self._thread.join()
        self._raise()
