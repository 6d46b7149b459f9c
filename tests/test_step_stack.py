"""The per-step phase stack: an ``other (no phase)`` segment so bars add up, binned beyond 40 steps."""

import struct

import polars as pl
import pytest
from nvtx_phases.analysis.aggregate.step_stack import OTHER, step_stack
from nvtx_phases.analysis.render.figures.phases import phase_time_per_step

MS = 1_000_000


def _phases(walls: dict[int, dict[str, float]]) -> pl.DataFrame:
    """One driver's ``step`` and ``step/<phase>`` rows, wall times in ms, phases in dict order."""
    rows = []
    for step, phases in walls.items():
        start = step * 1000 * MS
        for k, (name, ms) in enumerate(phases.items()):
            path = name if name == "step" else f"step/{name}"
            rows.append(
                {
                    "step": step,
                    "path": path,
                    "canonical": name,
                    "level": 0 if name == "step" else 1,
                    "wall_ns": int(ms * MS),
                    "start_ns": start + k,
                    **{c: 0 for c in ("gpu_busy_ns", "idle_ns", "nccl_ns", "memcpy_ns")},
                    "memcpy_bytes": 0,
                    "energy_j": None,
                }
            )
    return pl.DataFrame(rows, schema_overrides={"energy_j": pl.Float64})


def test_other_is_the_step_minus_its_phases_so_bars_add_up():
    phases = _phases(
        {
            1: {"step": 100, "gen": 50, "train": 30},
            2: {"step": 110, "gen": 60, "train": 30},
            3: {"step": 100, "gen": 70, "train": 30},  # no gap: no other segment
        }
    )
    stack = step_stack(phases)
    got = {(r["bar"], r["canonical"]): r["wall_ms"] for r in stack.iter_rows(named=True)}
    assert got == {
        ("1", "gen"): 50.0,
        ("1", "train"): 30.0,
        ("1", OTHER): 20.0,
        ("2", "gen"): 60.0,
        ("2", "train"): 30.0,
        ("2", OTHER): 20.0,
        ("3", "gen"): 70.0,
        ("3", "train"): 30.0,
    }


def test_beyond_the_bar_limit_steps_are_binned_as_means():
    walls = {s: {"step": 10.0 * s, "gen": 4.0 * s, "train": 2.0 * s} for s in range(1, 6)}
    stack = step_stack(_phases(walls), max_bars=2)
    # 5 steps in 2 bins: steps 1–3 (k·2//5 = 0, 0, 0) and 4–5
    got = {(r["bar"], r["canonical"]): r["wall_ms"] for r in stack.iter_rows(named=True)}
    assert got == pytest.approx(
        {
            ("1–3", "gen"): 8.0,
            ("1–3", "train"): 4.0,
            ("1–3", OTHER): 8.0,
            ("4–5", "gen"): 18.0,
            ("4–5", "train"): 9.0,
            ("4–5", OTHER): 18.0,
        }
    )


def _png_size(path):
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def test_the_figure_has_one_size_for_3_and_500_steps(tmp_path):
    few = _phases({s: {"step": 100, "gen": 50, "train": 30} for s in range(1, 4)})
    many = _phases({s: {"step": 100, "gen": 50, "train": 30} for s in range(1, 501)})
    small = phase_time_per_step(few, tmp_path / "few")[0]
    large = phase_time_per_step(many, tmp_path / "many")[0]
    assert _png_size(small) == _png_size(large) == (1600, 800)


def test_energy_per_phase_device_follows_execution_order_not_the_alphabet():
    from nvtx_phases.analysis.render.figures.phases import execution_order
    from nvtx_phases.analysis.run.pipeline import analyze

    result = analyze(["traces_sample/grpo_synthetic.sqlite"])
    order = [
        p for p in execution_order(result.phases) if p.startswith("step/") and p.count("/") == 1
    ]
    assert order == [
        "step/gen",
        "step/reward",
        "step/old_log_prob",
        "step/ref",
        "step/adv",
        "step/update_actor",
        "step/update_weights",
    ]
