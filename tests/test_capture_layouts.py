"""Capture layouts recorded with the real nsys, then analyzed: what the steps and phases become.

- Two processes under one ``nsys profile`` that each mark their own ``step`` ranges without
  payload (the torchrun pattern), staggered in time: each process keeps its own steps 0..N-1.
- VeRL 0.9.1's own nsys profiler code (no nvtx_phases hooks): the trainer's ``marked_timer``
  in a driver, ``DistProfiler.annotate`` stage labels in a worker process; the default phase map
  gives per-step rows for every one of them.

Each capture is made once per module (a few seconds for the ranks, about 15 s for VeRL's
imports) and bounded by a timeout.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from workloads import ranks_steps, verl_builtin_profiler

WORKLOADS = Path(__file__).resolve().parent / "workloads"
MS = 1_000_000
#: ``time.sleep(s)`` never returns early; nsys's clock and Python's monotonic clock may differ by
#: NTP slewing (≤ 500 ppm, 30 µs on 60 ms) and timestamp rounding: 1 ms covers both.
EARLY_NS = 1 * MS
#: What a range may last beyond the time slept in it: the NVTX calls (µs) and the scheduler's
#: wake-up latency, which on a loaded 2-core CI machine reaches a few ms. 20 ms bounds that and
#: is still below every difference the test must tell apart: the two ranks' durations of one
#: phase differ by 25–30 ms, and a row merging two ranges would be ≥ 2× the slept time.
LATE_NS = 20 * MS


def capture(nsys: str, script: Path, out: Path, *, timeout_s: float) -> Path:
    """``nsys profile`` of ``python script`` (NVTX and OS runtime only), exported to SQLite."""
    base = out / script.stem
    args = [
        nsys,
        "profile",
        "--trace=nvtx,osrt",
        "--sample=none",  # CPU sampling makes Debian's 2022.4 agent hang after the workload
        "--cpuctxsw=none",
        "--export=sqlite",
        "--force-overwrite",
        "true",
        "-o",
        str(base),
        sys.executable,
        str(script),
    ]
    log = out / f"{script.stem}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # nsys, its agent and the workload: our group
            proc.wait()
            pytest.fail(f"nsys profile timed out after {timeout_s} s; log: {log}")
    text = log.read_text(errors="replace")
    assert code == 0, f"nsys profile exit {code}:\n{text[-3000:]}"
    export = base.with_suffix(".sqlite")
    assert export.is_file(), f"no export written:\n{text[-3000:]}"
    return export


def only_missing_gpu_tables(warnings: list[str], export: Path) -> bool:
    """The run's only warning is that its (CPU-only) capture has no CUDA tables."""
    return len(warnings) == 1 and warnings[0].startswith(f"{export.stem}: no CUPTI_ACTIVITY_KIND")


# --- two processes, each with its own steps ---------------------------------------------------


@pytest.fixture(scope="module")
def ranks_export(nsys: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    return capture(nsys, WORKLOADS / "ranks_steps.py", out, timeout_s=120)


def ranks_by_start(phases: pl.DataFrame) -> dict[int, int]:
    """pid → rank: rank 0 starts its first step first (rank 1 waits ``DELAY_S``)."""
    first = phases.group_by("pid").agg(pl.col("start_ns").min()).sort("start_ns")
    assert first.height == 2, first
    return {pid: rank for rank, pid in enumerate(first["pid"])}


def check_ranks(phases: pl.DataFrame, steps: pl.DataFrame) -> None:
    """Each rank's rows: its own steps 0..N-1, one range per row, wall times as slept."""
    rank_of = ranks_by_start(phases)
    pid_of = {rank: pid for pid, rank in rank_of.items()}
    paths = ("step", *(f"step/{name}" for name in ranks_steps.PLAN[0]))
    expected = sorted(
        (pid_of[rank], step, path, 1)
        for rank in (0, 1)
        for step in range(ranks_steps.STEPS)
        for path in paths
    )
    # no GPU work: every range is a window-attributed row, so one row per (pid, step, path)
    assert set(phases["attribution"]) == {"window"}
    assert sorted(phases.select("pid", "step", "path", "n_ranges").rows()) == expected

    # the layout that the old run-wide step lookup got wrong: rank 1 runs behind rank 0, its
    # step 0 starting after rank 0's step 0 ended (in rank 0's step 3, in this run)
    def row(rank: int, step: int, path: str) -> dict:
        rows = phases.filter(
            (pl.col("pid") == pid_of[rank]) & (pl.col("step") == step) & (pl.col("path") == path)
        )
        return rows.row(0, named=True)

    assert row(1, 0, "step")["start_ns"] > row(0, 0, "step")["end_ns"]

    for rank, plan in ranks_steps.PLAN.items():
        for step in range(ranks_steps.STEPS):
            for name, seconds in plan.items():
                wall = row(rank, step, f"step/{name}")["wall_ns"]
                slept = round(seconds * 1e9)
                assert slept - EARLY_NS <= wall < slept + LATE_NS, (rank, step, name, wall)
            step_wall = row(rank, step, "step")["wall_ns"]
            slept = round(sum(plan.values()) * 1e9)
            assert slept - EARLY_NS <= step_wall < slept + LATE_NS, (rank, step, step_wall)

    # the steps table stays the union over processes: rank 0's start, rank 1's end
    assert steps.rows() == [
        (step, row(0, step, "step")["start_ns"], row(1, step, "step")["end_ns"])
        for step in range(ranks_steps.STEPS)
    ]


def test_two_processes_each_keep_their_own_steps(ranks_export: Path) -> None:
    result = analyze([ranks_export])
    check_ranks(result.phases, result.steps)
    # steps of different processes overlap in time: normal, not warned; the only warning is
    # that the capture has no GPU tables
    assert only_missing_gpu_tables(result.summary.to_dict()["warnings"], ranks_export)


def test_two_processes_through_the_cli(ranks_export: Path, tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("nvtx-phases")
    done = subprocess.run(
        [str(cli), "analyze", str(ranks_export), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    phases = pl.read_parquet(tmp_path / "out" / "phases.parquet")
    steps = pl.read_csv(tmp_path / "out" / "steps.csv")
    check_ranks(phases, steps.select("step", "step_start_ns", "step_end_ns"))
    assert pl.read_csv(tmp_path / "out" / "phases.csv").height == phases.height == 24


# --- VeRL 0.9.1's own profiler, no nvtx_phases hooks ----------------------------------------------


@pytest.fixture(scope="module")
def verl_export(nsys: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("verl") is None:
        if os.environ.get("NVTX_PHASES_REQUIRE_VERL") == "1":
            pytest.fail("verl is required here (NVTX_PHASES_REQUIRE_VERL=1) but not installed")
        pytest.skip("verl not installed (pip install -e .[verl])")
    out = tmp_path_factory.mktemp("verl")
    return capture(nsys, WORKLOADS / "verl_builtin_profiler.py", out, timeout_s=300)


def test_verl_builtin_profiler_names_are_phases_per_step(verl_export: Path) -> None:
    result = analyze([verl_export])  # default options: default phase map, no --all-ranges
    phases = result.phases
    driver = phases.filter(pl.col("path") == "step")["pid"].unique().to_list()
    assert len(driver) == 1 and phases["pid"].n_unique() == 2
    role = {pid: "driver" if pid == driver[0] else "worker" for pid in phases["pid"].unique()}

    workload = verl_builtin_profiler
    driver_phases = [name for name, _ in workload.DRIVER_PLAN]
    per_step = [("driver", "step", 1)] + [("driver", f"step/{name}", 1) for name in driver_phases]
    per_step += [
        ("worker", label, workload.MINI_BATCHES if label == "train_batch" else 1)
        for label in workload.WORKER_RANGES.values()
    ]
    expected = [(who, step, path, n) for step in range(workload.STEPS) for who, path, n in per_step]
    # the profiler's own start/stop ranges lie between steps: phases without a step
    expected += [
        ("driver", None, name, workload.STEPS) for name in ("start_profile", "stop_profile")
    ]
    got = [
        (role[pid], step, path, n)
        for pid, step, path, n in phases.select("pid", "step", "path", "n_ranges").rows()
    ]
    key = lambda r: (r[1] is None, r[1] or 0, r[0], r[2])  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)
    # the same, spelled out: every name VeRL's own profiler code gave a range is a phase
    assert set(phases["phase"]) == {
        # driver: RayPPOTrainer.fit's marked_timer names
        "step",
        "gen",
        "reward",
        "old_log_prob",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
        "update_weights",
        "dump_rollout_generations",
        "start_profile",
        "stop_profile",
        # worker: DistProfiler.annotate stage labels
        "actor_compute_log_prob",
        "ref_compute_log_prob",
        "train_batch",
        "actor_update",
    }
    assert sorted(phases["step"].drop_nulls().unique()) == [0, 1, 2]
    # VeRL's stage labels keep their own names (the default map renames nothing)
    assert phases.filter(pl.col("phase") != pl.col("canonical")).height == 0
    assert sorted(set(phases.filter(pl.col("level") == 0)["phase"])) == sorted(
        {"step", "start_profile", "stop_profile", *workload.WORKER_RANGES.values()}
    )

    # each worker range runs inside the driver phase that called it, in the same step
    for name, action in workload.DRIVER_PLAN:
        if not isinstance(action, str):
            continue
        for step in range(workload.STEPS):
            outer = phases.filter((pl.col("step") == step) & (pl.col("path") == f"step/{name}"))
            inner = phases.filter(
                (pl.col("step") == step) & (pl.col("path") == workload.WORKER_RANGES[action])
            )
            assert outer["start_ns"][0] < inner["start_ns"][0] < inner["end_ns"][0]
            assert inner["end_ns"][0] < outer["end_ns"][0], (name, step)
    assert only_missing_gpu_tables(result.summary.to_dict()["warnings"], verl_export)
