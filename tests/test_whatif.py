"""What-if bounds: constructed phase tables with known answers, then the CLI end to end on the
synthetic GRPO sample (numbers read straight from `analyze`'s tables) and on a logged
phase_times.csv."""

import dataclasses
import json

import polars as pl
import pytest
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

from analysis.cli import app
from analysis.errors import WorkloadInputError
from analysis.jobs.whatif import inputs_from_analysis, inputs_from_phase_times
from analysis.render.files import load_analysis
from analysis.workload.lengths import length_stats, read_packed_lengths
from analysis.workload.whatif import WhatIfInputs, run_level, whatif_table

runner = CliRunner()
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"


def _times(rows):
    return pl.DataFrame(rows, schema=["step", "phase", "seconds"], orient="row")


def _busy(rows):
    return pl.DataFrame(rows, schema=["step", "phase", "device", "busy_s"], orient="row")


def _inputs(times, busy=None, rank_ends=None, p90_tail=None, gap_energy=None, idle_power_w=None):
    return WhatIfInputs(times, busy, rank_ends, p90_tail, gap_energy, idle_power_w, "test")


def _row(table, bound, variant, step=1):
    rows = table.filter(
        (pl.col("bound") == bound) & (pl.col("variant") == variant) & (pl.col("step") == step)
    )
    assert rows.height == 1, (bound, variant, step)
    return rows.row(0, named=True)


# --- constructed tables ----------------------------------------------------------------------


def test_overlap_separate_gpus_is_the_longer_side():
    # step 1: gen 10 s + train 6 s; step 2: gen 12 s + train 6 s (the last step uses its own gen)
    times = _times([(1, "step", 16.0), (1, "gen", 10.0), (2, "step", 18.0), (2, "gen", 12.0)])
    table = whatif_table(_inputs(times))
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 12.0  # gen of k+1
    assert _row(table, "overlap_gen_train", "separate_gpus", 2)["bound_s"] == 12.0
    same = whatif_table(_inputs(_times([(1, "step", 16.0), (1, "gen", 10.0)])))
    row = _row(same, "overlap_gen_train", "separate_gpus")
    assert (row["bound_s"], row["saving_s"], row["saving_pct"]) == (10.0, 6.0, 37.5)


def test_overlap_shared_gpus_is_bounded_by_the_busiest_gpu():
    # gen 10 s (GPU busy 8 s and 6 s), rest 6 s (busy 5 s and 5 s): GPU 0 needs 13 s
    times = _times([(1, "step", 16.0), (1, "gen", 10.0)])
    busy = _busy(
        [
            (1, "step", "g0", 13.0),
            (1, "step", "g1", 11.0),
            (1, "gen", "g0", 8.0),
            (1, "gen", "g1", 6.0),
        ]
    )
    table = whatif_table(_inputs(times, busy))
    assert _row(table, "overlap_gen_train", "shared_gpus")["bound_s"] == 13.0
    # mostly idle GPUs: the overlap hides all of the shorter side
    idle = _busy([(1, "step", "g0", 4.0), (1, "gen", "g0", 2.0)])
    assert _row(whatif_table(_inputs(times, idle)), "overlap_gen_train", "shared_gpus")[
        "bound_s"
    ] == pytest.approx(10.0)


def test_straggler_tail_ends_at_the_p50_and_p90_rank():
    times = _times([(1, "step", 30.0), (1, "gen", 14.0), (2, "step", 30.0), (2, "gen", 14.0)])
    s = 1_000_000_000
    ends = [(1, pid, end * s) for pid, end in ((10, 10), (11, 10), (12, 14))]  # 3 ranks
    ends += [(2, 100 + i, (i + 1) * s) for i in range(10)]  # 10 ranks ending at 1 … 10 s
    rank_ends = pl.DataFrame(ends, schema=["step", "pid", "gen_end_ns"], orient="row")
    table = whatif_table(_inputs(times, rank_ends=rank_ends))
    assert _row(table, "no_straggler_tail", "p50_rank", 1)["saving_s"] == 4.0  # 4 s after p50
    assert _row(table, "no_straggler_tail", "p90_rank", 1)["saving_s"] == 0.0  # ⌈2.7⌉ = last
    assert _row(table, "no_straggler_tail", "p50_rank", 2)["saving_s"] == 5.0  # 5th of 10
    assert _row(table, "no_straggler_tail", "p90_rank", 2)["saving_s"] == 1.0  # 9th of 10
    assert _row(table, "no_straggler_tail", "p50_rank", 1)["bound_s"] == 26.0
    missing = _row(table, "no_straggler_tail", "p90_response", 1)
    assert missing["bound_s"] is None
    assert missing["assumption"] == "not available: no length records (--lengths)"


def test_balanced_ranks_remove_the_busiest_gpus_excess():
    # a 4 s phase with GPUs busy 3 s and 1 s: the busiest sheds 1 s above the mean (2 s)
    times = _times([(1, "step", 10.0), (1, "update_actor", 4.0), (1, "ref", 2.0)])
    busy = _busy(
        [
            (1, "step", "g0", 5.0),
            (1, "step", "g1", 3.0),
            (1, "update_actor", "g0", 3.0),
            (1, "update_actor", "g1", 1.0),
            (1, "ref", "g0", 1.0),  # no row for g1: idle, 0 s
        ]
    )
    table = whatif_table(_inputs(times, busy))
    assert _row(table, "balanced_dp", "update_actor")["bound_s"] == 3.0
    assert _row(table, "balanced_dp", "ref")["bound_s"] == 1.5
    assert _row(table, "balanced_dp", "whole_step")["bound_s"] == 8.5  # 10 − 1 − 0.5
    # a GPU-bound phase: the busiest GPU busy all along, so the phase scales to the mean
    gpu_bound = _busy([(1, "step", "g0", 4.0), (1, "step", "g1", 2.0)])
    gpu_bound = pl.concat(
        [gpu_bound, gpu_bound.with_columns(pl.lit("update_actor").alias("phase"))]
    )
    assert (
        _row(whatif_table(_inputs(times, gpu_bound)), "balanced_dp", "update_actor")["bound_s"]
        == 3.0
    )


def test_transition_cost_is_the_step_outside_its_phases():
    times = _times(
        [(1, "step", 20.0), (1, "gen", 10.0), (1, "reward", 4.0), (1, "update_actor", 3.0)]
    )
    gap = pl.DataFrame({"step": [1], "gap_energy_j": [123.0]})
    table = whatif_table(_inputs(times, gap_energy=gap, idle_power_w=200.0))
    row = _row(table, "no_transitions", "between_phases")
    assert (row["bound_s"], row["saving_s"], row["saving_pct"]) == (17.0, 3.0, 15.0)
    assert row["energy_saving_j"] == 123.0  # measured, not priced at idle power
    # every other bound prices its saving at the GPUs' idle power: 10 s × 200 W
    assert _row(table, "overlap_gen_train", "separate_gpus")["energy_saving_j"] == 2000.0


def test_bounds_without_their_data_say_why_and_the_run_table_skips_them():
    times = _times([(s, p, v) for s in (1, 2, 3) for p, v in (("step", 16.0 + s), ("gen", 10.0))])
    table = whatif_table(_inputs(times))
    assert table.columns == [
        "step", "bound", "variant", "measured_s", "bound_s", "saving_s", "saving_pct",
        "energy_saving_j", "assumption",
    ]  # fmt: skip
    shared = _row(table, "overlap_gen_train", "shared_gpus")
    assert shared["bound_s"] is None and shared["energy_saving_j"] is None
    assert shared["assumption"].startswith("not available: needs per-GPU busy time")
    run = {(r["bound"], r["variant"]): r for r in run_level(table).iter_rows(named=True)}
    separate = run[("overlap_gen_train", "separate_gpus")]
    # steps of 17, 18, 19 s, each saving its 10 s gen … rests 7, 8, 9 s: savings 7, 8, 9 s
    assert separate["steps"] == 3
    assert separate["median_saving_s"] == 8.0
    assert separate["saving_s"] == 24.0
    assert separate["run_saving_pct"] == pytest.approx(24 / 54 * 100)
    assert run[("balanced_dp", "whole_step")]["steps"] == 0
    assert run[("balanced_dp", "whole_step")]["saving_s"] is None


def test_phase_times_contract():
    frame = _times([(1, "step", 16.0), (1, "gen", 10.0), (1, "generate_sequences", 9.0)])
    inp = inputs_from_phase_times(frame)
    assert sorted(inp.times["phase"]) == ["gen", "step"]  # a timer nested in gen is left out
    for bad, message in (
        (_times([(1, "gen", 10.0)]), "no rows of phase 'step'"),
        (_times([(1, "step", 1.0), (1, "step", 2.0)]), "step 1 has phase 'step' twice"),
        (_times([(1, "step", -1.0)]), "negative"),
        (frame.drop("seconds"), "no column(s) seconds"),
    ):
        with pytest.raises(
            WorkloadInputError, match=message.replace("(", r"\(").replace(")", r"\)")
        ):
            inputs_from_phase_times(bad)


# --- the sample run, end to end --------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The sample analyzed by `analyze`, and `whatif` on the traces and on that folder."""
    root = tmp_path_factory.mktemp("whatif")
    done = runner.invoke(app, ["analyze", str(SAMPLE), "--out", str(root / "run"), "--no-figures"])
    assert done.exit_code == 0, done.output
    traces = runner.invoke(
        app, ["whatif", str(SAMPLE), "--out", str(root / "w")], terminal_width=200
    )
    assert traces.exit_code == 0, traces.output
    folder = runner.invoke(
        app, ["whatif", str(root / "run"), "--out", str(root / "wf"), "--no-figures"]
    )
    assert folder.exit_code == 0, folder.output
    return root, traces.output


def _window(root):
    phases = pl.read_parquet(root / "run" / "phases.parquet").filter(
        pl.col("attribution") == "window"
    )
    wall = {(r["step"], r["path"]): r["wall_ns"] for r in phases.iter_rows(named=True)}
    return phases, wall


def test_sample_overlap_and_transitions_from_the_phase_table(sample):
    root, _ = sample
    table = pl.read_csv(root / "w" / "whatif.csv")
    phases, wall = _window(root)
    for step in (1, 2, 3):
        step_ns, gen_ns = wall[(step, "step")], wall[(step, "step/gen")]
        next_gen = wall.get((step + 1, "step/gen"), gen_ns)
        row = _row(table, "overlap_gen_train", "separate_gpus", step)
        assert row["measured_s"] == step_ns / 1e9
        assert row["bound_s"] == pytest.approx(max(next_gen, step_ns - gen_ns) / 1e9, abs=1e-9)
        children = phases.filter((pl.col("step") == step) & (pl.col("level") == 1))["wall_ns"]
        row = _row(table, "no_transitions", "between_phases", step)
        assert row["saving_s"] == pytest.approx((step_ns - children.sum()) / 1e9, abs=1e-9)
        gap = phases.filter((pl.col("step") == step) & (pl.col("path") == "step"))["gap_energy_j"]
        assert row["energy_saving_j"] == pytest.approx(gap.item())
    # the numbers themselves: step 1 is 61.216415 ms with gen 24.600458 ms and 1.55 ms between
    # phases; its rest (36.615957 ms) outlasts step 2's gen, so overlap hides all of its gen
    assert _row(table, "overlap_gen_train", "separate_gpus")["saving_s"] == 0.024600458
    assert _row(table, "no_transitions", "between_phases")["saving_s"] == 0.00155


def test_sample_shared_gpus_and_balance_from_the_device_table(sample):
    root, _ = sample
    table = pl.read_csv(root / "w" / "whatif.csv")
    _, wall = _window(root)
    devices = pl.read_parquet(root / "run" / "phase_devices.parquet")
    busy = {
        (r["step"], r["path"], r["device"]): r["gpu_busy_ns"] for r in devices.iter_rows(named=True)
    }
    gpus = sorted({d for _, _, d in busy})
    idle_w = sum(json.loads((root / "run" / "summary.json").read_text())["idle_power_w"].values())
    assert idle_w == 180.0  # 90 W per GPU
    for step in (1, 2, 3):
        nxt = step + 1 if (step + 1, "step/gen") in wall else step
        busiest = max(
            busy[(nxt, "step/gen", d)] + busy[(step, "step", d)] - busy[(step, "step/gen", d)]
            for d in gpus
        )
        rest = wall[(step, "step")] - wall[(step, "step/gen")]
        row = _row(table, "overlap_gen_train", "shared_gpus", step)
        expected = max(wall[(nxt, "step/gen")], rest, busiest) / 1e9
        assert row["bound_s"] == pytest.approx(expected, abs=1e-9)
        assert row["energy_saving_j"] == pytest.approx(row["saving_s"] * idle_w)
        gen = [busy[(step, "step/gen", d)] for d in gpus]
        row = _row(table, "balanced_dp", "gen", step)
        excess = (max(gen) - sum(gen) / len(gen)) / 1e9
        assert row["bound_s"] == pytest.approx(wall[(step, "step/gen")] / 1e9 - excess, abs=1e-9)
    # step 1's gen: GPUs busy 19.563430 and 15.740283 ms, so balance saves 1.9115735 ms
    assert _row(table, "balanced_dp", "gen")["saving_s"] == pytest.approx(0.0019115735, abs=1e-9)


def test_sample_stragglers_from_the_rank_ranges(sample):
    root, _ = sample
    table = pl.read_csv(root / "w" / "whatif.csv")
    ranks = pl.read_parquet(root / "run" / "phases.parquet").filter(
        pl.col("canonical") == "generate_sequences"
    )
    stats = length_stats(read_packed_lengths([SAMPLES / "grpo_synthetic_lengths"]))
    for step in (1, 2, 3):
        rows = ranks.filter(pl.col("step") == step)
        first_end, last_end = sorted(rows["end_ns"])  # 2 ranks: p50 is the first, p90 the last
        assert _row(table, "no_straggler_tail", "p50_rank", step)["saving_s"] == pytest.approx(
            (last_end - first_end) / 1e9, abs=1e-9
        )
        assert _row(table, "no_straggler_tail", "p90_rank", step)["saving_s"] == 0.0
        p90, top = stats.filter(pl.col("step") == step).select("p90", "max").row(0)
        span = last_end - rows["start_ns"].min()
        assert _row(table, "no_straggler_tail", "p90_response", step)["saving_s"] == pytest.approx(
            span * (1 - p90 / top) / 1e9, abs=1e-9
        )
    # step 1: rank 2000's generation ends at 29.450458 ms, rank 2001's at 25.197877 ms
    assert _row(table, "no_straggler_tail", "p50_rank")["saving_s"] == 0.004252581


def test_sample_cli_output_folder_and_traces_agree(sample):
    root, output = sample
    assert "overlap_gen_train" in output and "73.46 ms" in output  # 24.60 + 25.46 + 23.40 ms
    assert "window phases of grpo_synthetic pid 1000" in output
    markdown = (root / "w" / "whatif.md").read_text()
    assert (
        "| overlap_gen_train | separate_gpus | 3 | 24.60 ms | 39.5% | 73.46 ms | 39.0% |"
        in markdown
    )
    assert "one-step-off async RL on separate GPUs" in markdown
    assert (root / "w" / "figures" / "whatif_per_step.png").exists()
    traces = pl.read_csv(root / "w" / "whatif.csv").filter(pl.col("variant") != "p90_response")
    folder = pl.read_csv(root / "wf" / "whatif.csv").filter(pl.col("variant") != "p90_response")
    assert traces.equals(folder)  # no length records beside the folder: only p90_response differs


def test_a_run_without_step_ranges_is_refused(sample):
    root, _ = sample
    with load_analysis(root / "run") as analysis:
        stepless = dataclasses.replace(
            analysis, phases=analysis.phases.filter(pl.col("attribution") != "window")
        )
        with pytest.raises(WorkloadInputError, match="no step range on a thread that launches"):
            inputs_from_analysis(stepless, name="stepless")


# --- logged stage times --------------------------------------------------------------------


def test_cli_on_logged_phase_times(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = ["step,phase,seconds", "1,step,16", "1,gen,10", "1,update_actor,6"]
    rows += ["2,step,20", "2,gen,10", "2,reward,2", "2,update_actor,5"]  # 3 s between phases
    (logs / "phase_times.csv").write_text("\n".join(rows) + "\n")
    done = runner.invoke(
        app, ["whatif", str(logs), "--out", str(tmp_path / "w")], terminal_width=200
    )
    assert done.exit_code == 0, done.output
    assert "logged stage times" in done.output
    table = pl.read_csv(tmp_path / "w" / "whatif.csv")
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 10.0
    assert _row(table, "overlap_gen_train", "separate_gpus", 2)["bound_s"] == 10.0
    assert _row(table, "no_transitions", "between_phases", 1)["saving_s"] == 0.0
    assert _row(table, "no_transitions", "between_phases", 2)["saving_s"] == 3.0
    for bound, variant in (("no_straggler_tail", "p50_rank"), ("balanced_dp", "whole_step")):
        row = _row(table, bound, variant, 2)
        assert row["bound_s"] is None and row["assumption"].startswith("not available: ")
    assert table["energy_saving_j"].is_null().all()


def test_cli_refuses_unusable_phase_times_in_one_line(tmp_path):
    bad = tmp_path / "phase_times.csv"
    bad.write_text("step,phase,seconds\n1,gen,10\n")
    done = runner.invoke(app, ["whatif", str(bad), "--out", str(tmp_path / "w")])
    assert done.exit_code == 2
    assert done.output.strip() == f"error: {bad}: no rows of phase 'step' (the step's own time)"
    bad.write_text("step,phase,seconds\n1,step,ten\n")
    done = runner.invoke(app, ["whatif", str(bad), "--out", str(tmp_path / "w")])
    assert done.exit_code == 2 and "not a phase_times.csv" in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_cpu_only_capture_says_the_bounds_are_wall_time(tmp_path):
    done = CliRunner().invoke(
        app,
        ["whatif", str(SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"), "--out", str(tmp_path / "w")],
    )
    assert done.exit_code == 0, done.output
    assert "no GPU activity in this run (CPU-only capture)" in done.output
