"""checks.gpu_capture: the CPU dry run under the real nsys, its import step, and the GPU checks.

The dry run's numbers are checked against plain SQL over its SQLite exports and against the
run's own files (workers' pids, the JSONL recorder), never against the analysis' own path.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from nvtxp_testkit import REPO, find_nsys_or_skip

model = importlib.import_module("checks.gpu_capture.model")
gpu_checks = importlib.import_module("checks.gpu_capture.gpu_checks")

STEPS = 2
GPU_ONLY = {
    "GPU work traced (CUPTI vs the device's CUDA)",
    "one physical GPU (UUID) for both workers",
    "GPU span vs CUDA events",
    "energy per phase: analysis vs counter reads",
    "graph time vs node kernel time",
}


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks.gpu_capture", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """One dry run: graph mode only (the node capture is the same on a CPU), 2 steps."""
    nsys = find_nsys_or_skip()
    out = tmp_path_factory.mktemp("gpu_capture")
    done = _run("--out", str(out), "--dry-run", "--steps", str(STEPS), "--modes", "graph",
                "--nsys", nsys)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def test_dry_run_says_so_and_skips_every_gpu_check(dry):
    out, stdout = dry
    assert stdout.startswith(model.DRY_NOTICE)
    report = json.loads((out / model.REPORT_JSON).read_text())
    assert report["dry"] and report["passed"]
    by_name = {c["name"]: c for c in report["checks"]}
    assert set(by_name) >= GPU_ONLY
    for c in report["checks"]:
        if c["name"] in GPU_ONLY:  # never a fake pass
            assert (c["status"], c["detail"]) == ("SKIP", model.NEEDS_GPU)
        else:
            assert c["status"] == "PASS", c
    assert model.DRY_NOTICE in (out / model.REPORT_MD).read_text()


def _sql_ranges(path: Path) -> list[tuple[int, str, int, int]]:
    """(pid, name, start, end) of every push/pop range, by plain SQL."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT (e.globalTid >> 24) & 16777215, COALESCE(e.text, s.value), e.start, e.end "
        "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.eventType IN (59, 70) ORDER BY e.start"
    ).fetchall()
    con.close()
    return rows


def test_driver_phase_table_matches_sql(dry):
    out, _ = dry
    ranges = _sql_ranges(out / "graph" / "driver.sqlite")
    steps = [r for r in ranges if r[1] == "step"]
    assert len(steps) == STEPS
    want = {}
    for k, (_, _, s0, s1) in enumerate(steps, start=1):
        want[(k, "step")] = s1 - s0
        inside = [r for r in ranges if r[1] != "step" and s0 <= r[2] and r[3] <= s1]
        assert [r[1] for r in inside] == list(model.DRIVER_PHASES)  # set, order and nesting
        want |= {(k, f"step/{r[1]}"): r[3] - r[2] for r in inside}
    phases = pl.read_csv(out / "graph" / "analysis" / "phases.csv")
    driver = phases.filter(
        (pl.col("trace") == "driver") & (pl.col("attribution") == "window")
        & pl.col("step").is_not_null()  # the warm-up round is no step
    )  # fmt: skip
    got = {(r["step"], r["path"]): r["wall_ns"] for r in driver.iter_rows(named=True)}
    assert got == want


def test_both_worker_processes_in_their_own_reports(dry):
    out, _ = dry
    events = json.loads((out / "graph" / model.EVENTS_FILE).read_text())
    for role, ops in (
        ("rollout", {"generate_sequences", "weight_sync"}),
        ("trainer", {"compute_log_prob", "compute_ref_log_prob", "update_actor", "weight_sync"}),
    ):
        ranges = _sql_ranges(out / "graph" / f"{role}.sqlite")
        assert {r[0] for r in ranges} == {events["hellos"][role]["pid"]}
        names = [r[1] for r in ranges]
        assert set(names) == ops
        assert all(names.count(op) == STEPS + 1 for op in ops)  # warm-up + each step
    driver_pids = {r[0] for r in _sql_ranges(out / "graph" / "driver.sqlite")}
    assert driver_pids == {events["driver_pid"]}


def test_import_step_on_a_brought_back_folder(dry, tmp_path):
    out, _ = dry
    back = tmp_path / "back"
    back.mkdir()
    for name in ("capture.json", "graph.tar.gz"):  # exactly what the device hands back
        shutil.copy(out / name, back / name)
    done = _run("--step", "import", "--out", str(back), "--modes", "graph")
    assert done.returncode == 0, done.stdout + done.stderr
    first = json.loads((out / model.REPORT_JSON).read_text())["checks"]
    again = json.loads((back / model.REPORT_JSON).read_text())["checks"]
    assert [(c["name"], c["status"]) for c in again] == [(c["name"], c["status"]) for c in first]


def test_failed_capture_is_a_failure_without_traceback(tmp_path):
    manifest = {"dry": False, "sizes": {"steps": 3}, "captures": [
        {"mode": "graph", "exit_status": 1, "timed_out": False, "seconds": 0.5, "files": [],
         "packed": "graph.tar.gz", "packed_bytes": 10, "too_big_to_bring_back": False},
    ]}  # fmt: skip
    (tmp_path / "capture.json").write_text(json.dumps(manifest))
    done = _run("--step", "import", "--out", str(tmp_path), "--modes", "graph", timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    checks = json.loads((tmp_path / model.REPORT_JSON).read_text())["checks"]
    assert [c["status"] for c in checks] == ["FAIL", "FAIL"]  # capture; graph vs node


def _mode_run(mode: str, rows: list[dict], replies: list[dict]) -> object:
    base = {"pid": 11, "attribution": "projection", "path": "generate_sequences",
            "gpu_busy_ns": 0}  # fmt: skip
    return gpu_checks.ModeRun(
        mode=mode, phases=pl.DataFrame([base | r for r in rows]), ranges=pl.DataFrame(),
        devices=[], recorder=pl.DataFrame(),
        events={"driver_pid": 10, "hellos": {"rollout": {"pid": 11}, "trainer": {"pid": 12}},
                "sizes": {"tokens": 4}, "replies": replies},
    )  # fmt: skip


def test_graph_vs_node_allows_the_measured_replay_overhead():
    cfg = model.Config(out=Path("."), tol_graph=0.0)
    node_reply = {"role": "rollout", "op": "generate_sequences", "step": 1,
                  "replays_ns": [260, 260, 260, 260]}  # fmt: skip
    node = _mode_run("node", [{"step": 1, "kernel_ns": 1000, "n_kernels": 8, "n_graphs": 0,
                               "graph_ns": 0}], [node_reply])  # fmt: skip
    for graph_ns, status in ((1040, "PASS"), (960, "PASS"), (1041, "FAIL")):
        graph = _mode_run("graph", [{"step": 1, "kernel_ns": 0, "n_kernels": 0, "n_graphs": 4,
                                     "graph_ns": graph_ns}], [])  # fmt: skip
        check = gpu_checks.check_graph_vs_node(graph, node, cfg)
        assert check.status == status, (graph_ns, check.detail)  # overhead 1040 − 1000 = 40 ns


def test_events_span_gate():
    cfg = model.Config(out=Path("."), tol_events_ns=1000)
    reply = {"role": "rollout", "op": "generate_sequences", "step": 1, "elapsed_ns": 100_000}
    for span, status in ((99_500, "PASS"), (100_400, "PASS"), (97_900, "FAIL"), (101_100, "FAIL")):
        run = _mode_run("graph", [{"step": 1, "gpu_start_ns": 0, "gpu_end_ns": span}], [reply])
        run.phases = run.phases.with_columns(pl.lit(None, pl.Int64).alias("gpu_busy_ns"))
        checks = gpu_checks.check_events(run, cfg)
        assert checks[0].status == status, (span, checks[0].detail)
