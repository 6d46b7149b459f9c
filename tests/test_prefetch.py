"""Read-ahead threads and rowid-sliced reads: same rows, bounded memory, errors surface."""

import threading
import time

import polars as pl
import pytest
from nvtx_phases.analysis.read import specs as T
from nvtx_phases.analysis.read.export import Export
from nvtx_phases.analysis.read.prefetch import Prefetched, in_threads
from nvtx_phases.analysis.run.load import _runtime, _slices
from nvtxp_testkit import SAMPLES

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"


def _wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "producer never got there"
        time.sleep(0.005)


def test_prefetched_reads_ahead_at_most_depth_items_and_keeps_order():
    made: list[int] = []

    def produce():
        for i in range(20):
            made.append(i)
            yield i

    with Prefetched(produce, depth=3) as items:
        # nothing asked for yet: reading has started, and stops at depth items
        _wait_for(lambda: len(made) == 3)
        time.sleep(0.05)
        assert len(made) == 3
        assert next(items) == 0
        _wait_for(lambda: len(made) == 4)
        time.sleep(0.05)
        assert len(made) == 4
        assert list(items) == list(range(1, 20))


def test_prefetched_raises_the_producers_error_where_it_happened():
    def produce():
        yield 1
        yield 2
        raise ValueError("bad batch")

    got = []
    with pytest.raises(ValueError, match="bad batch"), Prefetched(produce) as items:
        for item in items:
            got.append(item)
    assert got == [1, 2]


def test_closing_early_stops_the_producer_and_runs_its_cleanup():
    closed = threading.Event()

    def produce():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    items = Prefetched(produce, depth=2)
    assert next(items) == 0
    items.close()
    assert closed.is_set()
    assert list(items) == []


def test_in_threads_keeps_input_order():
    assert in_threads(lambda x: x * x, [3, 1, 2], threads=2) == [9, 1, 4]


def test_rowid_slices_cover_the_span_once():
    assert _slices((1, 11), 2) == [(1, 6), (6, 11)]
    assert _slices((5, 6), 4) == [(5, 6)]
    assert _slices(None, 2) == [None]


def test_sliced_runtime_read_equals_the_whole_table():
    export = Export(SAMPLE)
    try:
        whole = pl.concat(export.batches(T.RUNTIME, 1000))
        span = export.rowid_span(T.RUNTIME)
        sliced = pl.concat(
            batch
            for rowids in _slices(span, 3)
            for batch in export.batches(T.RUNTIME, 1000, rowids=rowids)
        )
    finally:
        export.close()
    assert span == (1, whole.height + 1)
    assert sliced.equals(whole)
    launches = _runtime(SAMPLE, "grpo")
    assert launches.height == whole.filter(pl.col("correlationId") != 0).height
    assert launches["correlation_id"].to_list() == (
        whole.filter(pl.col("correlationId") != 0)["correlationId"].to_list()
    )


def test_pages_are_exact_in_file_order_however_sparse_the_rowids(tmp_path):
    import shutil
    import sqlite3

    sparse = tmp_path / "sparse.sqlite"
    shutil.copy(SAMPLE, sparse)
    with sqlite3.connect(sparse) as con:  # holes and a far rowid, as deletes and imports leave
        con.execute(f"DELETE FROM {T.RUNTIME.name} WHERE rowid % 7 = 3")
        con.execute(f"UPDATE {T.RUNTIME.name} SET rowid = 10000000000 WHERE rowid = 5")
    export = Export(sparse)
    try:
        whole = export.read(T.RUNTIME)
        pages = list(export.batches(T.RUNTIME, 100))
    finally:
        export.close()
    assert whole is not None
    assert [p.height for p in pages[:-1]] == [100] * (len(pages) - 1)
    assert 0 < pages[-1].height <= 100
    assert whole.height == 1156
    assert pl.concat(pages).equals(whole)  # a table scan: rowid order, the far row last
