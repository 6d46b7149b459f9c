"""``synth --memory``: CUDA memory events with a known profile; analysis equals the ground truth.

The generator's truth (:func:`analysis.synth.truth.memory_truth`) is a brute force over the rows
it wrote, not :mod:`analysis.aggregate.memory`; the hand values and SQL below are a third path.
Without ``--memory`` the export is what it was: no memory table, every other table unchanged.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtxp_testkit import SAMPLES

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
MIB, GIB = 1 << 20, 1 << 30
CASES = {
    "one file": SynthConfig(steps=2, ranks=3, kernels_per_phase=12, seed=5, memory=True),
    "split, reward model": SynthConfig(
        steps=2, ranks=2, kernels_per_phase=8, split_files=True, reward_model=True, memory=True
    ),
}


def _generate(tmp_path: Path, cfg: SynthConfig) -> tuple[list[Path], dict]:
    if cfg.split_files:
        paths = generate(tmp_path / "run", cfg)
        truth_path = tmp_path / "run" / "ground_truth.json"
    else:
        paths = generate(tmp_path / "run.sqlite", cfg)
        truth_path = tmp_path / "run.ground_truth.json"
    return paths, json.loads(truth_path.read_text())


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    cfg = CASES[request.param]
    paths, truth = _generate(tmp_path_factory.mktemp("mem"), cfg)
    with analyze(paths) as result:
        yield cfg, paths, truth, result


def _gpu(device: str) -> int:
    """The synthetic run's GPU index of a device label (``run:1``, ``worker_rank1:1``)."""
    return int(device.rsplit(":", 1)[1])


def test_every_row_equals_the_ground_truth(run):
    cfg, _, truth, result = run
    assert not any(TABLE in note for note in result.notes)
    table = result.memory
    assert table is not None
    assert set(table["basis"]) == {truth["memory"]["basis"]} == {"since_capture_start"}
    want = {}
    for attribution in ("window", "projection"):
        for r in truth["memory"][attribution]:
            want[(attribution, r["pid"], r["step"], r["path"], r["gpu"])] = r
    got = {
        (r["attribution"], r["pid"], r["step"], r["path"], _gpu(r["device"])): r
        for r in table.iter_rows(named=True)
    }
    assert got.keys() == want.keys()  # every row, no other
    assert len(want) == (len(truth["driver_phases"]) * cfg.ranks + len(truth["worker_phases"]))
    exact = ["start_ns", "end_ns", "n_events", "entry_bytes", "peak_bytes"]
    for key, w in want.items():
        g = got[key]
        assert [g[c] for c in exact] == [w[c] for c in exact], key
        assert (g["h2d_bytes"], g["d2h_bytes"]) == (w["h2d_bytes"], w["d2h_bytes"]), key
        # the analysis integrates in float64 over the whole run; the truth exactly (Fraction)
        assert g["mean_bytes"] == pytest.approx(w["mean_bytes"], rel=1e-12, abs=0), key


def test_the_known_profile_by_hand(run):
    """Hand values of the profile (analysis.synth.memory's doc) against the analysis."""
    cfg, _, _, result = run
    table = result.memory
    assert table is not None

    def row(attribution: str, step: int, path: str, gpu: int) -> dict:
        rows = table.filter(
            (pl.col("attribution") == attribution)
            & (pl.col("step") == step)
            & (pl.col("path") == path)
            & pl.col("device").str.ends_with(f":{gpu}")
        )
        assert rows.height == 1, (attribution, step, path, gpu)
        return rows.row(0, named=True)

    for gpu in range(cfg.ranks):
        weights = 4 * MIB + 2 * GIB + gpu * 64 * MIB  # static + weights, before the first step
        base = weights + 8 * MIB  # and the step's batch buffer
        kv = 4 * (256 - 32 * gpu) * MIB
        optimizer = GIB + gpu * 16 * MIB
        for step in range(1, cfg.steps + 1):
            assert row("window", step, "step", gpu)["entry_bytes"] == weights
            gen = row("window", step, "step/gen", gpu)
            # the first KV block at gen's very start counts in gen, not in its entry
            assert (gen["entry_bytes"], gen["peak_bytes"], gen["n_events"]) == (base, base + kv, 5)
            # pinned host memory (reward → adv, the offload's staging buffer) never counts
            reward = row("window", step, "step/reward", gpu)
            assert reward["peak_bytes"] == reward["entry_bytes"] + (
                512 * MIB if cfg.reward_model else 0
            )
            ref = row("window", step, "step/ref", gpu)  # freed exactly at ref's end: not in it
            assert (ref["peak_bytes"], ref["n_events"]) == (base + 64 * MIB, 1)
            actor = row("projection", step, "update_actor", gpu)
            assert actor["entry_bytes"] == base
            assert actor["peak_bytes"] == base + optimizer + 128 * MIB
            offload = row("window", step, "step/update_weights", gpu)
            assert offload["entry_bytes"] == base + optimizer
            assert offload["peak_bytes"] == offload["entry_bytes"]  # it only frees
            assert base < offload["mean_bytes"] < base + optimizer


def test_entry_levels_by_sql_over_the_raw_rows(run):
    """Each window row's entry level = Σ± bytes of device-kind rows before it, in plain SQL.

    Split: GPU g's rows are in ``worker_rank{g}.sqlite``, whose session started (g + 1) ×
    ``file_start_stagger_ns`` after the driver's (the run's clock).
    """
    cfg, paths, _, result = run
    table = result.memory
    assert table is not None
    pinned = 0
    for gpu in range(cfg.ranks):
        if cfg.split_files:
            path, shift = paths[0].with_name(f"worker_rank{gpu}.sqlite"), gpu + 1
        else:
            path, shift = paths[0], 0
        shift *= cfg.file_start_stagger_ns
        with sqlite3.connect(path) as db:
            kinds = dict(db.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND").fetchall())
            assert (kinds[1], kinds[2], kinds[5]) == ("Pinned", "Device", "Device Static")
            (n,) = db.execute(
                f"SELECT COUNT(*) FROM {TABLE} WHERE memKind = 1 AND deviceId = ?", (gpu,)
            ).fetchone()
            pinned += n
            rows = table.filter(
                (pl.col("attribution") == "window") & pl.col("device").str.ends_with(f":{gpu}")
            )
            assert rows.height == len(result.phases.filter(pl.col("attribution") == "window"))
            for r in rows.iter_rows(named=True):
                (entry,) = db.execute(
                    "SELECT COALESCE(SUM(CASE memoryOperationType WHEN 0 THEN bytes "
                    f"ELSE -bytes END), 0) FROM {TABLE} WHERE memKind IN (2, 3, 5) "
                    "AND deviceId = ? AND start < ?",
                    (gpu, r["start_ns"] - shift),
                ).fetchone()
                assert r["entry_bytes"] == entry, (r["path"], r["step"], gpu)
    assert pinned == 4 * cfg.steps * cfg.ranks  # reward→adv and the staging buffer: alloc, free


def _rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: db.execute(f"SELECT * FROM {n} ORDER BY rowid").fetchall() for n in names}


def test_without_memory_the_export_is_unchanged(tmp_path):
    """No table without --memory; with it, every other table and the truth as without."""
    sample = SAMPLES / "grpo_synthetic.sqlite"  # written before --memory existed
    truth = json.loads((SAMPLES / "grpo_synthetic.ground_truth.json").read_text())
    cfg = SynthConfig(**truth["config"])
    assert not cfg.memory
    (plain,) = generate(tmp_path / "plain.sqlite", cfg)
    (with_memory,) = generate(tmp_path / "memory.sqlite", replace(cfg, memory=True))
    bundled, now, more = _rows(sample), _rows(plain), _rows(with_memory)
    assert TABLE not in bundled and TABLE not in now
    assert now == bundled
    assert more.pop(TABLE) and more == bundled
    again = json.loads((tmp_path / "plain.ground_truth.json").read_text())
    assert again == truth
    memory_truth = json.loads((tmp_path / "memory.ground_truth.json").read_text())
    assert memory_truth.pop("memory") and memory_truth["config"].pop("memory") is True
    assert memory_truth == truth
