"""Bad input gets a named error or a named warning, never a traceback or a silent wrong number."""

import json
import shutil
import sqlite3

import polars as pl
import pytest
from nvtx_phases.analysis.errors import MissingColumns, NotAnNsysExport, TraceReadError
from nvtx_phases.analysis.read.export import read_export
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate


@pytest.fixture
def small_run(tmp_path):
    return generate(tmp_path / "run.sqlite", SynthConfig(steps=2, ranks=1, kernels_per_phase=4))[0]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceReadError, match="no such file"):
        read_export(tmp_path / "nope.sqlite")
    with pytest.raises(TraceReadError, match="is a directory"):
        read_export(tmp_path)


def test_empty_file_is_not_an_export(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(NotAnNsysExport, match="not an Nsight Systems export"):
        read_export(empty)


def test_json_renamed_and_garbage(tmp_path):
    fake = tmp_path / "trace.sqlite"
    fake.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceReadError, match="file is not a database"):
        read_export(fake)


def test_truncated_export(tmp_path, small_run):
    data = small_run.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceReadError, match=r"malformed|not a database"):
        read_export(cut)


def test_other_sqlite_database(tmp_path):
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    with pytest.raises(NotAnNsysExport):
        read_export(other)


def test_export_is_opened_read_only(tmp_path, small_run):
    before = small_run.read_bytes()
    small_run.chmod(0o444)
    analyze([small_run])
    assert small_run.read_bytes() == before
    assert not list(tmp_path.glob("*-journal")) and not list(tmp_path.glob("*-wal"))


def test_renamed_column_is_named_in_the_error(tmp_path, small_run):
    broken = tmp_path / "broken.sqlite"
    shutil.copy(small_run, broken)
    with sqlite3.connect(broken) as con:
        con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN deviceId TO gpuId")
    with pytest.raises(
        MissingColumns, match=r"CUPTI_ACTIVITY_KIND_KERNEL lacks column\(s\) deviceId"
    ):
        read_export(broken)


def test_missing_tables_are_reported_and_analysis_goes_on(tmp_path, small_run):
    gpu_only = tmp_path / "gpu_only.sqlite"
    shutil.copy(small_run, gpu_only)
    with sqlite3.connect(gpu_only) as con:
        con.execute("DROP TABLE NVTX_EVENTS")
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    result = analyze([gpu_only])
    assert result.summary.to_dict()["missing_tables"] == [
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "NVTX_EVENTS",
    ]
    assert result.summary.to_dict()["attributed_gpu_ns"] == 0
    assert (
        result.summary.to_dict()["unattributed_gpu_ns"]
        == result.summary.to_dict()["total_gpu_ns"]
        > 0
    )
    assert any(
        "no NVTX_EVENTS, CUPTI_ACTIVITY_KIND_RUNTIME (not captured)" in w for w in result.warnings
    )


def test_unclosed_and_backwards_ranges_are_warned(tmp_path, small_run):
    odd = tmp_path / "odd.sqlite"
    shutil.copy(small_run, odd)
    with sqlite3.connect(odd) as con:
        gtid = con.execute(
            "SELECT globalTid FROM NVTX_EVENTS WHERE text = 'update_actor' LIMIT 1"
        ).fetchone()[0]
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?,?,?,?,?,?)",
            (5_000_000_000, None, 59, "update_actor", gtid, 0),
        )
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?,?,?,?,?,?)",
            (900, 100, 59, "gen", gtid, 0),
        )
    result = analyze([odd])
    assert any("1 NVTX range(s) never closed" in w for w in result.warnings)
    assert any("1 NVTX range(s) end before they start; dropped" in w for w in result.warnings)


def test_duplicate_correlation_ids_are_warned(tmp_path, small_run):
    dup = tmp_path / "dup.sqlite"
    shutil.copy(small_run, dup)
    with sqlite3.connect(dup) as con:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT start + 1, end + 1, eventClass, globalTid, "
            "correlationId, nameId, returnValue, callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 3"
        )
    result = analyze([dup])
    assert "3 correlationId(s) appear on more than one CUDA API call" in " ".join(result.warnings)
    total = result.summary.to_dict()
    assert (
        total["projection_attributed_gpu_ns"] + total["projection_unattributed_gpu_ns"]
        == total["total_gpu_ns"]
    )


def test_unicode_and_markup_range_names_survive(tmp_path, small_run):
    named = tmp_path / "named.sqlite"
    shutil.copy(small_run, named)
    with sqlite3.connect(named) as con:
        con.execute(
            "UPDATE NVTX_EVENTS SET text = 'génération [bold]<script>' WHERE text = 'generate_sequences'"
        )
    from nvtx_phases.analysis.attribute.phase_map import default_phase_map

    result = analyze([named], phase_map=default_phase_map().with_all_ranges())
    assert "génération [bold]<script>" in result.phases["phase"].to_list()
    assert result.phases.filter(pl.col("phase").str.starts_with("gén"))["kernel_ns"].sum() > 0


def test_errors_survive_pickling():
    import pickle

    for error in (
        TraceReadError("a.sqlite", "file is not a database"),
        NotAnNsysExport("b.sqlite"),
        MissingColumns("c.sqlite", "NVTX_EVENTS", ["start"]),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
