"""The real fully async VeRL 0.9.1 run (``make profile-verl VERL_MODE=fully_async``), committed.

``tests/data/verl_async_run/``: VeRL's own ``FullyAsyncTrainer`` and ``FullyAsyncRollouter`` on
separate (CPU, logical-GPU) pools, 6 trainer steps of 2 prompts (n = 2), a parameter sync every 2
steps, one validation, captured by Debian's nsys 2022.4 with the nvtx_phases hooks
(``verl_async.sqlite``: driver and every Ray worker in one export) and VeRL's console log
(``verl_console.log``). No VeRL needed here: what each test expects is computed from the export
with plain SQL (``sqlite3``) and from the log with a regex, never through ``analyze``'s code.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from typer.testing import CliRunner

from nvtx_phases.naming import POOL_MARK_PATTERN, SAMPLES_MARK_PATTERN

DATA = Path(__file__).parent / "data" / "verl_async_run"
SQLITE = DATA / "verl_async.sqlite"
LOG = DATA / "verl_console.log"
#: trainer steps of the run, and how many make one parameter version (``trigger_parameter_sync_step``)
STEPS, TRIGGER = 6, 2
#: trajectories per trainer step: ``ppo_mini_batch_size`` 2 prompts × ``rollout.n`` 2
SAMPLES_PER_STEP = 4
runner = CliRunner()

RANGES_SQL = """
SELECT (e.globalTid >> 24) & 16777215 AS pid, COALESCE(e.text, s.value) AS name,
       e.category AS category, e.start AS start, e."end" AS end_ns
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType IN (59, 60) AND e."end" IS NOT NULL
ORDER BY e.start, e."end"
"""
MARKS_SQL = """
SELECT (e.globalTid >> 24) & 16777215 AS pid, COALESCE(e.text, s.value) AS text
FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
WHERE e.eventType = 34 ORDER BY e.start
"""


def _rows(sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{SQLITE}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


@pytest.fixture(scope="module")
def ranges() -> list[tuple[int, str, int | None, int, int]]:
    """Every closed NVTX range of the export: ``(pid, name, category, start, end)``."""
    return _rows(RANGES_SQL)


@pytest.fixture(scope="module")
def marks() -> list[tuple[int, str]]:
    return _rows(MARKS_SQL)


def _pid_of(ranges, name: str) -> int:
    pids = {r[0] for r in ranges if r[1] == name}
    assert len(pids) == 1, (name, pids)
    return pids.pop()


def _of(ranges, pid: int, name: str) -> list[tuple[int, str, int | None, int, int]]:
    return [r for r in ranges if r[0] == pid and r[1] == name]


def _log_records() -> list[dict[str, float]]:
    """The trainer actor's logged records, in order: ``step`` and every ``key:value``."""
    records = []
    line_re = re.compile(r"\(FullyAsyncTrainer pid=\d+\)\S* step:(\d+) - (.*)$")
    for line in LOG.read_text(encoding="utf-8").splitlines():
        match = line_re.search(line)
        if not match:
            continue
        record: dict[str, float] = {"step": float(match.group(1))}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            number = re.fullmatch(r"(?:np\.\w+\()?(-?[\d.e+-]+)\)?", value.strip())
            if key and number:
                record[key] = float(number.group(1))
        records.append(record)
    return records


def test_every_role_marks_its_ranges_with_its_axis(ranges):
    trainer, rollouter = _pid_of(ranges, "step"), _pid_of(ranges, "version")
    assert trainer != rollouter
    # the trainer controller: one step range per trainer step (the last, ended by the
    # rollouter's end-of-data signal inside gen, too), payload = VeRL's global_steps
    steps = _of(ranges, trainer, "step")
    assert [r[2] for r in steps] == list(range(1, STEPS + 2))
    names = Counter(r[1] for r in ranges if r[0] == trainer)
    for stage in ("reward", "ref", "adv", "update_actor"):
        assert names[stage] == STEPS, stage
    assert names["gen"] == STEPS + 1  # the last step's too
    # param_sync: before training, at the end of each cycle, and once after the loop
    syncs = _of(ranges, trainer, "param_sync")
    assert len(syncs) == STEPS // TRIGGER + 2
    # each stage range lies inside the step range of its payload
    by_step = {r[2]: r for r in steps}
    for row in ranges:
        if row[0] == trainer and row[1] in ("gen", "update_actor", "adv") and row[2] in by_step:
            step = by_step[row[2]]
            assert step[3] <= row[3] and row[4] <= step[4], row
    # the rollouter: one version range per parameter version it generated with, payload = the
    # version (nvtx 0.2.8, the last that nsys 2022.4 records, carries it in the category, where
    # 0 means none: version 0 has no payload), tiling its timeline
    versions = _of(ranges, rollouter, "version")
    assert [r[2] for r in versions] == [None, *range(1, len(versions))]
    assert len(versions) == STEPS // TRIGGER
    assert all(a[4] <= b[3] for a, b in itertools.pairwise(versions))
    children = Counter(r[1] for r in ranges if r[0] == rollouter)
    assert children["gen"] >= len(versions) and children["staleness_wait"] >= 1
    assert children["validate"] == 1  # VeRL validated once (test_freq = 2, 3 versions)
    for name in ("gen", "staleness_wait", "validate"):
        for row in _of(ranges, rollouter, name):  # inside a version, with its payload
            inside = [v for v in versions if v[3] <= row[3] and row[4] <= v[4]]
            assert len(inside) == 1 and inside[0][2] == row[2], row


def test_pool_marks_name_the_role_of_every_pooled_process(ranges, marks):
    trainer, rollouter = _pid_of(ranges, "step"), _pid_of(ranges, "version")
    pools = defaultdict(list)
    for pid, text in marks:
        match = re.match(POOL_MARK_PATTERN, text or "")
        if match:
            pools[pid].append((match.group(1), match.group(2)))
    assert all(len(v) == 1 for v in pools.values())  # once per process
    roles = {pid: v[0][0] for pid, v in pools.items()}
    assert roles[trainer] == "trainer" and roles[rollouter] == "rollout"
    # the trainer's worker (update_actor's kernels on a GPU run), the rollout server (the
    # refit bubble: param_sync) and the rollout-side checkpoint-engine worker (weight_sync)
    worker = _pid_of([r for r in ranges if r[0] != trainer], "update_actor")
    server = _pid_of([r for r in ranges if r[0] not in (trainer,)], "param_sync")
    assert roles[worker] == "trainer" and roles[server] == "rollout"
    syncing = {r[0] for r in ranges if r[1] == "weight_sync"}
    assert {roles.get(p) for p in syncing} == {"trainer", "rollout"}
    assert sorted(Counter(roles.values()).items()) == [("rollout", 3), ("trainer", 2)]
    assert all(gpus is None for v in pools.values() for _, gpus in v)  # a CPU run: no GPU


def test_samples_marks_carry_each_steps_parameter_versions(ranges, marks):
    trainer = _pid_of(ranges, "step")
    samples = []
    for pid, text in marks:
        match = re.match(SAMPLES_MARK_PATTERN, text or "")
        if match:
            assert pid == trainer
            versions = dict(map(int, item.split(":")) for item in match.group(3).split(","))
            samples.append((int(match.group(1)), int(match.group(2)), versions))
    assert [s for s, _, _ in samples] == list(range(1, STEPS + 1))  # one per trained step
    for step, version, versions in samples:
        assert version == (step - 1) // TRIGGER  # the trainer's version in that step
        assert sum(versions.values()) == SAMPLES_PER_STEP
        assert all(0 <= version - v <= 1 for v in versions)  # staleness threshold 0.5: lag ≤ 1
    # against VeRL's own count: trajectories ≥ 1 version behind, cumulative, at each record's
    # last step (MetricsAggregator's "last")
    logged = {
        int(r["training/global_step"]): r["fully_async/count/stale_trajectory_processed"]
        for r in _log_records()
        if "training/global_step" in r
    }
    assert len(logged) >= 3
    for last, count in logged.items():
        stale = sum(n for s, V, vs in samples if s <= last for v, n in vs.items() if V - v >= 1)
        assert stale == count, last
    assert any(V - v >= 1 for _, V, vs in samples for v in vs)  # the run did train off-policy


def test_rollout_generation_overlaps_training(ranges):
    trainer, rollouter = _pid_of(ranges, "step"), _pid_of(ranges, "version")
    gens = _of(ranges, rollouter, "gen")
    updates = _of(ranges, trainer, "update_actor")
    overlap = sum(max(0, min(g[4], u[4]) - max(g[3], u[3])) for g in gens for u in updates)
    assert overlap > 50_000_000  # ns: the pools ran at the same time, not in turn


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verl_async")
    result = runner.invoke(app, ["analyze", str(SQLITE), "--out", str(out / "run")])
    assert result.exit_code == 0, result.output
    args = ["fidelity", str(out / "run"), "--log", str(LOG), "--out", str(out / "fid")]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return out / "fid"


def _fidelity_rows(fidelity: Path) -> dict[tuple[str, int, int, str], dict[str, str]]:
    with (fidelity / "fidelity_steps.csv").open() as handle:
        return {
            (r["axis"], int(r["step"]), int(r["trace_first"]), r["stage"]): r
            for r in csv.DictReader(handle)
        }


def test_fidelity_against_verls_async_timers_is_at_least_99_percent(fidelity):
    summary = json.loads((fidelity / "summary.json").read_text())
    assert summary["overall_accuracy_pct"] >= 99.0
    stages = set(summary["stages"])
    assert {"step", "gen", "update_actor", "param_sync", "version", "active", "validate"} <= stages
    assert summary["missing_in_trace"] == []


def test_fidelity_rollouter_numbers_recomputed_from_the_log_and_the_export(fidelity, ranges):
    rows = _fidelity_rows(fidelity)
    rollouter = _pid_of(ranges, "version")
    versions = _of(ranges, rollouter, "version")
    waits = _of(ranges, rollouter, "staleness_wait")
    records = [r for r in _log_records() if "fully_async/rollouter/version_time" in r]
    # the first record times the rollouter's start-up; the k-th after it, version k - 1
    for k, version in enumerate(versions):
        record = records[k + 1]
        traced = (version[4] - version[3]) / 1e9
        logged = record["fully_async/rollouter/version_time"]
        row = rows[("rollout", int(record["step"]), k, "version")]
        assert float(row["trace_s"]) == pytest.approx(traced, rel=1e-9)
        assert float(row["logged_s"]) == pytest.approx(logged, rel=1e-6)
        assert float(row["error_pct"]) == pytest.approx((traced - logged) / logged * 100, rel=1e-6)
        assert abs(traced - logged) / logged < 0.01
        # active: until the last staleness_wait of the version began (VeRL's idle_start_time)
        starts = [w[3] for w in waits if version[3] <= w[3] <= version[4]]
        active = (max(starts) - version[3]) / 1e9 if starts else traced
        active_row = rows[("rollout", int(record["step"]), k, "active")]
        assert float(active_row["trace_s"]) == pytest.approx(active, rel=1e-9)
        assert abs(active - record["fully_async/rollouter/active_time"]) / active < 0.01
    validate = _of(ranges, rollouter, "validate")[0]
    logged = next(r for r in _log_records() if "rollouter/validate_time" in r)
    row = rows[("rollout", int(logged["step"]), 0, "validate")]
    assert float(row["trace_s"]) == pytest.approx((validate[4] - validate[3]) / 1e9, rel=1e-9)
    assert float(row["logged_s"]) == pytest.approx(logged["rollouter/validate_time"], rel=1e-6)


def test_fidelity_trainer_records_sum_their_steps(fidelity, ranges):
    rows = _fidelity_rows(fidelity)
    trainer = _pid_of(ranges, "step")
    records = [r for r in _log_records() if "training/global_step" in r]
    first = 1
    for record in records:
        last = int(record["training/global_step"])
        for stage in ("step", "update_actor", "gen"):
            traced = sum(
                r[4] - r[3] for r in _of(ranges, trainer, stage) if first <= (r[2] or 0) <= last
            )
            row = rows[("trainer", int(record["step"]), first, stage)]
            assert int(row["trace_last"]) == last
            assert float(row["trace_s"]) == pytest.approx(traced / 1e9, rel=1e-9)
            assert float(row["logged_s"]) == pytest.approx(record[f"timing_s/{stage}"], rel=1e-6)
        first = last + 1
    assert first == STEPS + 1  # every trained step is in one record


# --- the run's GPU pools, as analyze reports them --------------------------------------------


@pytest.fixture(scope="module")
def pooled():
    from nvtx_phases.analysis.run.pipeline import analyze

    return analyze(SQLITE)


def test_pools_are_the_marked_roles_with_their_processes(pooled, marks):
    marked: dict[str, set[int]] = defaultdict(set)
    for pid, text in marks:
        match = re.match(POOL_MARK_PATTERN, text or "")
        if match:
            marked[match.group(1)].add(pid)
    assert set(marked) == {"trainer", "rollout"}
    assert pooled.pools is not None
    for row in pooled.pools.iter_rows(named=True):
        pids = {int(p.rsplit(":", 1)[1]) for p in row["processes"].split(",")}
        if row["pool"] == "unpooled":  # processes that mark no pool (VeRL's reward loop worker)
            assert not pids & set().union(*marked.values())
            continue
        assert row["source"] == "marks" and pids == marked[row["pool"]]
        # a CPU run: no GPU, so no GPU time to attribute (null, not 0) and none said missing
        assert row["n_devices"] == 0 and row["captured"] is False
        assert row["total_gpu_ns"] is None
    assert not any("GPU work not captured" in w for w in pooled.warnings)


def test_rollouter_rows_carry_versions_and_overlap_the_trainers(pooled, ranges):
    trainer, rollouter = _pid_of(ranges, "step"), _pid_of(ranges, "version")
    rows = pooled.phases.filter(pl.col("attribution") == "window")
    versions = rows.filter((pl.col("pid") == rollouter) & (pl.col("path") == "version"))
    assert set(versions["pool"]) == {"rollout"}
    # each version row's step is its range's payload (parameter version), as marked
    marked = {r[2] for r in _of(ranges, rollouter, "version")}
    assert set(versions["step"].to_list()) == marked
    steps = rows.filter((pl.col("pid") == trainer) & (pl.col("path") == "step"))
    assert set(steps["pool"]) == {"trainer"}
    assert set(steps["step"].to_list()) == {r[2] for r in _of(ranges, trainer, "step")}
    gens = rows.filter((pl.col("pid") == rollouter) & (pl.col("path") == "version/gen"))
    updates = rows.filter((pl.col("pid") == trainer) & (pl.col("path") == "step/update_actor"))
    overlap = sum(
        max(0, min(g["end_ns"], u["end_ns"]) - max(g["start_ns"], u["start_ns"]))
        for g in gens.iter_rows(named=True)
        for u in updates.iter_rows(named=True)
    )
    assert overlap > 50_000_000


def test_idle_causes_cover_each_pools_span_with_no_gpu_time(pooled):
    """Each pool's causes add up to its span (first start to last end of its window ranges)."""
    causes = pooled.idle_causes
    assert causes is not None
    window = pooled.ranges.filter(pl.col("attribution") == "window")
    for pool in ("trainer", "rollout"):
        mine = window.filter(pl.col("pool") == pool)
        span = mine["end_ns"].max() - mine["start_ns"].min()
        rows = causes.filter(pl.col("pool") == pool)
        assert rows["wall_ns"].sum() == span
        assert rows["idle_ns"].null_count() == rows.height  # no GPU: idle unknown, not 0
    trainer = causes.filter(pl.col("pool") == "trainer")
    assert "starvation" in set(trainer["cause"])  # the trainer's gen: waiting on the queue
