"""The bad-input corpus, through the CLI: every case is a correct result with a named warning,
or a one-line error naming the problem and exit status 2 — never a traceback.

Each case is made here from a small synthetic export (no binary fixtures).
"""

import json
import shutil
import sqlite3

import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from typer.testing import CliRunner

runner = CliRunner()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    # enough operations (about 2,000) that --chunk-ops 1000 spills and buckets them
    cfg = SynthConfig(steps=2, ranks=1, kernels_per_phase=100, power=False, lengths=False)
    return generate(folder / "base.sqlite", cfg)[0]


def sql(*statements):
    def mutate(path):
        with sqlite3.connect(path) as con:
            for statement in statements:
                con.execute(statement)

    return mutate


def raw_bytes(data):
    def make(path):
        path.write_bytes(data)

    return make


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def corrupt_kernel_table(path):
    # zero the kernel table's root page: the file opens and its small tables read, then the
    # streamed read of kernels (in the read-ahead thread) hits a malformed page
    with sqlite3.connect(path) as con:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        root = con.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'"
        ).fetchone()[0]
    data = bytearray(path.read_bytes())
    data[(root - 1) * page_size : root * page_size] = bytes(page_size)
    path.write_bytes(bytes(data))


def other_sqlite(path):
    path.unlink()
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE users (id INTEGER)")


WORKER = "(SELECT globalTid FROM NVTX_EVENTS WHERE text = 'update_actor' LIMIT 1)"

CASES = {
    # name: (make the file, exit code, text the output must contain)
    "empty file": (raw_bytes(b""), 2, "not an Nsight Systems export"),
    "truncated": (truncate, 2, "cannot read as an SQLite export"),
    "corrupt kernel pages": (corrupt_kernel_table, 2, "cannot read as an SQLite export"),
    "json renamed": (raw_bytes(b'{"traceEvents": []}'), 2, "file is not a database"),
    "other sqlite": (other_sqlite, 2, "not an Nsight Systems export"),
    "no NVTX table": (sql("DROP TABLE NVTX_EVENTS"), 0, "no NVTX_EVENTS"),
    "no kernel table": (
        sql("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL"),
        0,
        "no CUPTI_ACTIVITY_KIND_KERNEL",
    ),
    "no runtime table": (
        sql("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME"),
        0,
        "no CUPTI_ACTIVITY_KIND_RUNTIME",
    ),
    "NVTX only": (
        sql(
            *(
                f"DROP TABLE {t}"
                for t in (
                    "CUPTI_ACTIVITY_KIND_KERNEL",
                    "CUPTI_ACTIVITY_KIND_MEMCPY",
                    "CUPTI_ACTIVITY_KIND_MEMSET",
                    "CUPTI_ACTIVITY_KIND_RUNTIME",
                )
            )
        ),
        0,
        "No GPU activity",
    ),
    "renamed column": (
        sql("ALTER TABLE NVTX_EVENTS RENAME COLUMN globalTid TO tid"),
        2,
        "NVTX_EVENTS lacks column(s) globalTid",
    ),
    "push without pop": (
        sql(
            f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (9000000000, NULL, 59, 'update_actor', {WORKER}, 0)"
        ),
        0,
        "never closed",
    ),
    "end before start": (
        sql(
            f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (500, 100, 59, 'gen', {WORKER}, 0)"
        ),
        0,
        "end before they start",
    ),
    "range crossing steps": (
        sql(
            f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (40000000, 90000000, 59, 'generate_sequences', {WORKER}, 0)"
        ),
        0,
        "run past the end of their step",
    ),
    "overlapping steps": (
        sql("UPDATE NVTX_EVENTS SET end = end + 20000000 WHERE int64Value = 1"),
        0,
        "start before the previous step ends",
    ),
    "duplicate correlationIds": (
        sql(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT start + 1, end + 1, eventClass, globalTid, correlationId, nameId, returnValue, callchainId FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 2"
        ),
        0,
        "appear on more than one CUDA API call",
    ),
    "kernels ending before they start": (
        sql("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000 WHERE rowid % 10 = 0"),
        0,
        "kernel operation(s) end before they start",
    ),
    "kernels without launch": (
        sql("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE rowid % 5 = 0"),
        0,
        "have no matching CUDA API call",
    ),
    "zero-length ranges": (
        sql(
            f"INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (6000000, 6000000, 59, 'compute_log_prob', {WORKER}, 0)"
        ),
        0,
        "Phases per step",
    ),
    "unicode names": (
        sql(
            "UPDATE NVTX_EVENTS SET text = 'génération ✓ [red]x[/red]' WHERE text = 'generate_sequences'"
        ),
        0,
        "Phases per step",
    ),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("case", list(CASES))
def test_corpus_case(case, chunked, base, tmp_path):
    make, code, text = CASES[case]
    path = tmp_path / "trace.sqlite"
    shutil.copy(base, path)
    make(path)
    # --chunk-ops 1000 with a tiny spill budget: the streamed, spilled, bucketed path
    chunk = ["--chunk-ops", "1000", "--spill-dir", str(tmp_path)] if chunked else []
    result = runner.invoke(
        app, ["analyze", str(path), "--out", str(tmp_path / "out"), "--no-figures", *chunk]
    )
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    assert text in result.output
    if code == 2:
        assert len(result.output.strip().splitlines()) == 1
    else:
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        if chunked and summary["n_gpu_ops"] > 1000:
            assert summary["n_buckets"] == 2


def test_unaligned_file_in_a_multi_file_run(base, tmp_path):
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    shutil.copy(base, first)
    shutil.copy(base, second)
    sql("DELETE FROM TARGET_INFO_SESSION_START_TIME")(second)
    result = runner.invoke(
        app, ["analyze", str(tmp_path), "--out", str(tmp_path / "out"), "--no-figures", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "NOT aligned" in result.output


def test_missing_inputs(tmp_path):
    result = runner.invoke(app, ["analyze", str(tmp_path / "nope.sqlite")])
    assert result.exit_code == 2 and "no such file" in result.output
    result = runner.invoke(app, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "holds no *.sqlite" in result.output


def test_unusable_spill_folder(base, tmp_path):
    result = runner.invoke(
        app,
        ["analyze", str(base), "--out", str(tmp_path / "out"), "--spill-dir", str(tmp_path / "no")],
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "cannot make a work folder" in result.output


def test_backward_operations_are_left_out_of_the_totals(base, tmp_path):
    """Kernels with a negative duration are counted in a warning and nowhere else: the totals
    equal plain SQL over the forward operations, and GPU time is still conserved."""
    path = tmp_path / "trace.sqlite"
    shutil.copy(base, path)
    sql("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000 WHERE rowid % 10 = 0")(path)
    with sqlite3.connect(path) as con:
        n_back, n_kernels, kernel_ns = con.execute(
            "SELECT SUM(end < start), SUM(end >= start), SUM(CASE WHEN end >= start"
            " THEN end - start END) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()
    result = runner.invoke(
        app, ["analyze", str(path), "--out", str(tmp_path / "out"), "--no-figures"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert n_back == 101
    assert f"{n_back:,} kernel operation(s) end before they start" in " ".join(summary["warnings"])
    assert summary["n_kernels"] == n_kernels
    assert summary["kernel_ns"] == kernel_ns
    assert summary["gpu_time_conserved"] is True
