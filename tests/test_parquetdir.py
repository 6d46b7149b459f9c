"""parquetdir exports (``nsys export --type parquetdir``, nsys 2024.6+) analyze like their SQLite.

Debian's nsys 2022.4 cannot write parquetdir, so every real SQLite export in ../shared/traces
(and the VeRL CPU run) is written as one with :func:`sqlite_to_parquetdir` (the SQLite export's
tables and columns, one ``TABLE.parquet`` each, declared types, text byte for byte: invalid
UTF-8 included, as nsys writes it); every output ``analyze`` writes must equal the SQLite
path's, byte for byte (``summary.json`` without provenance and input paths, the file's own name
in warnings aside).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from nvtx_phases.analysis.errors import TraceReadError
from nvtx_phases.analysis.read import specs as T
from nvtx_phases.analysis.read.convert import sqlite_to_parquetdir
from nvtx_phases.analysis.read.export import open_export, read_export
from nvtx_phases.analysis.read.parquetdir import ParquetDirExport, is_parquetdir
from nvtx_phases.analysis.run.inputs import folder_inputs, resolve_trace_inputs
from nvtxp_testkit import REPO, SPLIT_SAMPLE, TRACES, output_digests

EXPORTS = [
    *sorted(TRACES.glob("*.sqlite")),
    *sorted((TRACES / "wild").glob("*.sqlite")),
    REPO / "tests/data/verl_cpu_run/verl_grpo.sqlite",
]


def outputs(trace: Path, out: Path, all_ranges: bool = True) -> dict[str, object]:
    """Every file ``analyze`` writes (:func:`nvtxp_testkit.output_digests`), the name masked."""
    return output_digests(trace, out, all_ranges=all_ranges, name=trace.name)


@pytest.fixture(scope="module")
def parquetdirs(tmp_path_factory) -> dict[str, Path]:
    if not EXPORTS[0].exists():
        pytest.skip(f"{TRACES} not present")
    root = tmp_path_factory.mktemp("parquetdirs")
    return {e.name: sqlite_to_parquetdir(e, root / f"{e.stem}.parquetdir") for e in EXPORTS}


@pytest.mark.parametrize("export", EXPORTS, ids=[e.stem for e in EXPORTS])
def test_every_output_equals_the_sqlite_path(export, parquetdirs, tmp_path):
    folder = parquetdirs[export.name]
    assert is_parquetdir(folder)
    modes = (False, True) if export.stem == "verl_grpo" else (True,)
    for all_ranges in modes:
        want = outputs(export, tmp_path / f"sqlite{all_ranges}", all_ranges)
        got = outputs(folder, tmp_path / f"parquet{all_ranges}", all_ranges)
        assert got == want


def test_invalid_utf8_text_is_read_like_sqlite(parquetdirs):
    """Real files hold invalid UTF-8 in TEXT columns; Polars refuses such Parquet strings."""
    export = next(e for e in EXPORTS if e.name.startswith("CoderGodness"))
    folder = parquetdirs[export.name]
    with pytest.raises(pl.exceptions.ComputeError, match="UTF-8"):
        pl.read_parquet(folder / "TARGET_INFO_SYSTEM_ENV.parquet")
    a, b = read_export(export), read_export(folder)
    assert a.frames.keys() == b.frames.keys()
    for name, frame in a.frames.items():
        assert frame.equals(b.frames[name]), name
    assert (a.host, a.driver_version, a.meta) == (b.host, b.driver_version, b.meta)


def test_narrower_integer_types_read_as_sqlite_does(parquetdirs, tmp_path):
    """Where nsys's Parquet types are not int64 (ids as int32, uint64 globalTids), same result."""
    export = TRACES / "nsysai_h100_2gpu_1s.sqlite"
    folder = shutil.copytree(parquetdirs[export.name], tmp_path / "n" / f"{export.stem}.parquetdir")
    for path in folder.glob("*.parquet"):
        table = pq.read_table(path)
        fields = []
        for field in table.schema:
            kind = field.type
            if pa.types.is_int64(kind):
                values = table.column(field.name)
                fits = values.null_count == len(values) or (
                    pa.compute.max(values).as_py() < 2**31 and pa.compute.min(values).as_py() >= 0
                )
                kind = pa.int32() if fits else pa.uint64()
            fields.append(pa.field(field.name, kind))
        pq.write_table(table.cast(pa.schema(fields)), path)
    assert str(pl.read_parquet_schema(folder / "StringIds.parquet")["id"]) == "Int32"
    want = outputs(export, tmp_path / "a")
    assert outputs(folder, tmp_path / "b") == want


def test_a_folder_of_parquetdirs_is_one_run(tmp_path):
    # not "run": the folder's name is masked in the outputs, and notes say "the run's exports"
    folder = tmp_path / "split_capture"
    for export in SPLIT_SAMPLE:
        sqlite_to_parquetdir(export, folder / f"{export.stem}.parquetdir")
    found = resolve_trace_inputs([folder])
    assert [p.name for p in found] == [f"{e.stem}.parquetdir" for e in SPLIT_SAMPLE]
    want = outputs(SPLIT_SAMPLE[0].parent, tmp_path / "a", all_ranges=False)
    got = outputs(folder, tmp_path / "b", all_ranges=False)
    assert {k: v for k, v in got.items() if k != "summary:warnings"} == {
        k: v for k, v in want.items() if k != "summary:warnings"
    }


def test_one_export_per_name_in_a_folder(tmp_path):
    sample = SPLIT_SAMPLE[0]
    shutil.copy(sample, tmp_path / "A.sqlite")
    sqlite_to_parquetdir(sample, tmp_path / "A.parquetdir")
    sqlite_to_parquetdir(sample, tmp_path / "B_pqtdir")
    (tmp_path / "C.nsys-rep").write_bytes(b"")
    sqlite_to_parquetdir(sample, tmp_path / "C.parquetdir")
    (tmp_path / "not_an_export").mkdir()
    names = [p.name for p in folder_inputs(tmp_path)]
    # the SQLite file over a parquetdir of the same name; a report over both
    assert names == ["A.sqlite", "B_pqtdir", "C.nsys-rep"]


def test_reads_only_declared_columns(parquetdirs):
    folder = parquetdirs["nsysai_h100_2gpu_1s.sqlite"]
    export = open_export(folder)
    assert isinstance(export, ParquetDirExport)
    kernels = export.read(T.KERNELS)
    assert kernels is not None
    assert kernels.columns == [*T.KERNELS.required, *T.KERNELS.optional]
    span = export.rowid_span(T.KERNELS)
    assert span == (0, kernels.height)
    parts = list(export.batches(T.KERNELS, 1000))
    assert pl.concat(parts).equals(kernels)
    halves = [(0, kernels.height // 2), (kernels.height // 2, kernels.height)]
    sliced = [b for h in halves for b in export.batches(T.KERNELS, 700, rowids=h)]
    assert pl.concat(sliced).equals(kernels)


def test_a_damaged_table_is_one_line(parquetdirs, tmp_path):
    folder = shutil.copytree(parquetdirs["nsysai_h100_2gpu_1s.sqlite"], tmp_path / "d.parquetdir")
    (folder / "NVTX_EVENTS.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(TraceReadError, match="cannot read as an nsys parquetdir export") as info:
        read_export(folder)
    assert "\n" not in str(info.value)
