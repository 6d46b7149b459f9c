"""What-if bounds: constructed phase tables with known answers, then the CLI end to end on the
synthetic GRPO sample (numbers read straight from `analyze`'s tables) and on a logged
phase_times.csv."""

import dataclasses
import json

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import WorkloadInputError
from nvtx_phases.analysis.render.outputs.files import load_analysis
from nvtx_phases.analysis.workload.lengths import length_stats, read_packed_lengths
from nvtx_phases.analysis.workload.whatif import WhatIfInputs, run_level, whatif_table
from nvtx_phases.analysis.workload.whatif_inputs import (
    inputs_from_analysis,
    inputs_from_phase_times,
)
from nvtx_phases.analysis.workload.whatif_pipeline import dominant_steps
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

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


def test_overlap_separate_gpus_is_a_pipeline_with_fill_and_drain():
    # step 1: gen 10 s + rest 6 s; step 2: gen 12 s + rest 6 s. Step 1's gen runs alone (fill),
    # then step 1's rest beside step 2's gen (12 s), then step 2's rest alone (drain): 28 s
    times = _times([(1, "step", 16.0), (1, "gen", 10.0), (2, "step", 18.0), (2, "gen", 12.0)])
    table = whatif_table(_inputs(times))
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 10.0 + 12.0
    assert _row(table, "overlap_gen_train", "separate_gpus", 2)["bound_s"] == 6.0
    run = run_level(table).row(0, named=True)
    assert (run["bound"], run["variant"], run["saving_s"]) == (
        "overlap_gen_train",
        "separate_gpus",
        6.0,
    )
    # one step: nothing to overlap with, no saving (the old bound said 6 s, 37.5 %)
    same = whatif_table(_inputs(_times([(1, "step", 16.0), (1, "gen", 10.0)])))
    row = _row(same, "overlap_gen_train", "separate_gpus")
    assert (row["bound_s"], row["saving_s"], row["saving_pct"]) == (16.0, 0.0, 0.0)


def test_overlap_steps_in_order_and_a_missing_gen_says_which():
    # steps need not be consecutive (a --steps 1,3,7 selection): the next step is the next row
    times = _times([(1, "step", 16.0), (1, "gen", 10.0), (3, "step", 9.0), (3, "gen", 2.0)])
    table = whatif_table(_inputs(times))
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 10.0 + 6.0
    assert _row(table, "overlap_gen_train", "separate_gpus", 3)["bound_s"] == 7.0
    gapped = _times([(1, "step", 16.0), (1, "gen", 10.0), (2, "step", 9.0), (3, "step", 5.0)])
    table = whatif_table(_inputs(gapped))
    row = _row(table, "overlap_gen_train", "separate_gpus", 1)
    assert row["bound_s"] is None
    assert row["assumption"] == "not available: no gen phase in the next step (2)"
    assert _row(table, "overlap_gen_train", "separate_gpus", 2)["assumption"] == (
        "not available: no gen phase in this step"
    )


def test_overlap_shared_gpus_is_bounded_by_the_busiest_gpu():
    # step 1: gen 10 s, rest 6 s (GPUs busy 13 − 8 = 5 s and 11 − 6 = 5 s in it); step 2's gen
    # 4 s (GPUs busy 4 s and 1 s): the slot beside step 1's rest needs GPU 0 for 5 + 4 = 9 s
    times = _times([(1, "step", 16.0), (1, "gen", 10.0), (2, "step", 7.0), (2, "gen", 4.0)])
    busy = _busy(
        [
            (1, "step", "g0", 13.0),
            (1, "step", "g1", 11.0),
            (1, "gen", "g0", 8.0),
            (1, "gen", "g1", 6.0),
            (2, "step", "g0", 6.0),
            (2, "step", "g1", 3.0),
            (2, "gen", "g0", 4.0),
            (2, "gen", "g1", 1.0),
        ]
    )
    table = whatif_table(_inputs(times, busy))
    assert _row(table, "overlap_gen_train", "shared_gpus", 1)["bound_s"] == 10.0 + 9.0
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 10.0 + 6.0
    assert _row(table, "overlap_gen_train", "shared_gpus", 2)["bound_s"] == 3.0  # drain
    # mostly idle GPUs: the overlap hides all of the shorter side
    idle = busy.with_columns(pl.col("busy_s") / 10)
    assert _row(whatif_table(_inputs(times, idle)), "overlap_gen_train", "shared_gpus")[
        "bound_s"
    ] == pytest.approx(16.0)


def test_a_dominant_step_is_found_against_the_median_of_the_others():
    steps = pl.DataFrame({"step": [1, 2, 3, 4], "step_s": [112.0, 1.2, 1.0, 40.0]})
    found = dominant_steps(steps)
    # step 1: 112 ≥ 3 × median(1.2, 1.0, 40) = 3.6; step 4: 40 ≥ 3 × median(112, 1.2, 1.0)
    assert found.rows() == [(1, 112.0, 1.2), (4, 40.0, 1.2)]
    assert dominant_steps(steps.head(2)).rows() == [(1, 112.0, 1.2)]  # 2 steps: the other one
    assert dominant_steps(steps.head(1)).is_empty()
    flat = pl.DataFrame({"step": [1, 2, 3], "step_s": [2.0, 1.0, 1.5]})
    assert dominant_steps(flat).is_empty()


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
    step_1 = [(1, "step", 20.0), (1, "gen", 10.0), (1, "reward", 4.0), (1, "update_actor", 3.0)]
    times = _times([*step_1, (2, "step", 20.0), (2, "gen", 10.0)])
    gap = pl.DataFrame({"step": [1], "gap_energy_j": [123.0]})
    table = whatif_table(_inputs(times, gap_energy=gap, idle_power_w=200.0))
    row = _row(table, "no_transitions", "between_phases")
    assert (row["bound_s"], row["saving_s"], row["saving_pct"]) == (17.0, 3.0, 15.0)
    assert row["energy_saving_j"] == 123.0  # measured, not priced at idle power
    # every other bound prices its saving at the GPUs' idle power: step 2 (the drain) takes
    # its rest, 10 s, saving its gen: 10 s × 200 W
    assert _row(table, "overlap_gen_train", "separate_gpus", 2)["energy_saving_j"] == 2000.0


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
    # steps of 17, 18, 19 s with gen 10 s, rests 7, 8, 9 s: the pipeline takes 10 (fill) +
    # max(10, 7) + max(10, 8) + 9 (drain) = 39 s; per step 20, 10, 9 s: savings −3, 8, 10 s
    assert separate["steps"] == 3
    assert separate["median_saving_s"] == 8.0
    assert separate["saving_s"] == 54.0 - 39.0
    assert separate["run_saving_pct"] == pytest.approx(15 / 54 * 100)
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
        fill = gen_ns if step == 1 else 0  # the first gen runs alone; the last rest too (drain)
        slot = max(wall.get((step + 1, "step/gen"), 0), step_ns - gen_ns)
        row = _row(table, "overlap_gen_train", "separate_gpus", step)
        assert row["measured_s"] == step_ns / 1e9
        assert row["bound_s"] == pytest.approx((fill + slot) / 1e9, abs=1e-9)
        children = phases.filter((pl.col("step") == step) & (pl.col("level") == 1))["wall_ns"]
        row = _row(table, "no_transitions", "between_phases", step)
        assert row["saving_s"] == pytest.approx((step_ns - children.sum()) / 1e9, abs=1e-9)
        gap = phases.filter((pl.col("step") == step) & (pl.col("path") == "step"))["gap_energy_j"]
        assert row["energy_saving_j"] == pytest.approx(gap.item())
    # the numbers themselves: step 1 is 61.216415 ms with gen 24.600458 ms and 1.55 ms between
    # phases; its gen is the pipeline's fill and its rest (36.615957 ms) outlasts step 2's gen,
    # so step 1 saves nothing; step 3 (the drain) saves its gen, 23.398877 ms
    assert _row(table, "overlap_gen_train", "separate_gpus")["saving_s"] == 0.0
    assert _row(table, "overlap_gen_train", "separate_gpus", 3)["saving_s"] == 0.023398877
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
        nxt = step + 1  # none after step 3: the drain, its rest alone
        busiest = max(
            busy.get((nxt, "step/gen", d), 0)
            + busy[(step, "step", d)]
            - busy[(step, "step/gen", d)]
            for d in gpus
        )
        rest = wall[(step, "step")] - wall[(step, "step/gen")]
        fill = wall[(1, "step/gen")] if step == 1 else 0
        row = _row(table, "overlap_gen_train", "shared_gpus", step)
        expected = (fill + max(wall.get((nxt, "step/gen"), 0), rest, busiest)) / 1e9
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
    # before the fill counted: 73.46 ms (24.60 + 25.46 + 23.40 ms), step 1's gen saved as if
    # it overlapped anything; now steps 2 and 3 save their gens, 25.46 + 23.40 ms
    assert "overlap_gen_train" in output and "48.86 ms" in output
    assert "window phases of grpo_synthetic pid 1000" in output
    markdown = (root / "w" / "whatif.md").read_text()
    assert (
        "| overlap_gen_train | separate_gpus | 3 | 23.40 ms | 37.4% | 48.86 ms | 26.0% |"
        in markdown
    )
    assert "gen_1 + Σ_{k=1}^{n−1} max(gen_{k+1}, rest_k) + rest_n" in markdown
    assert "## Warnings" not in markdown  # no step dominates the sample
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
    # step 1's gen alone (fill), then max(step 2's gen, step 1's rest), then step 2's rest
    assert _row(table, "overlap_gen_train", "separate_gpus", 1)["bound_s"] == 10.0 + 10.0
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
    assert " ".join(done.output.split()) == (
        f"error: {bad}: no rows of phase 'step' (the step's own time; `nvtx-phases logs` writes "
        "one for every step)"
    )
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


# --- a warm-up step, --steps, the figure's numbers ---------------------------------------------


def _warm_up_logs(tmp_path):
    """``logs`` on two VeRL 0.9.1 console steps whose step 1 holds vLLM's warm-up in its gen."""
    log = tmp_path / "warm.log"
    log.write_text(
        "(TaskRunner pid=7) step:1 - timing_s/gen:110.6 - timing_s/update_actor:1.4 - "
        "timing_s/step:112.0\n"
        "(TaskRunner pid=7) step:2 - timing_s/gen:0.5 - timing_s/update_actor:0.7 - "
        "timing_s/step:1.2\n"
    )
    done = runner.invoke(app, ["logs", str(log), "--out", str(tmp_path / "logs")])
    assert done.exit_code == 0, done.output
    return tmp_path / "logs"


def test_a_warm_up_is_the_pipeline_fill_and_is_warned(tmp_path):
    logs = _warm_up_logs(tmp_path)
    done = runner.invoke(
        app, ["whatif", str(logs), "--out", str(tmp_path / "w")], terminal_width=200
    )
    assert done.exit_code == 0, done.output
    run = pl.read_csv(tmp_path / "w" / "whatif.csv").filter(pl.col("variant") == "separate_gpus")
    # before: step 1 took max(step 2's gen, its rest) = 1.4 s, its 110.6 s gen saved as if it
    # overlapped anything: "run saving 111 s, 98.1%". Now the pipeline: 110.6 (fill) + max(0.5,
    # 1.4) + 0.7 (drain) = 112.7 s of 113.2 s measured: 0.5 s, 0.4%
    assert run["bound_s"].to_list() == [112.0, 0.7]
    assert run["saving_s"].sum() == pytest.approx(0.5, abs=1e-9)
    assert (
        "| overlap_gen_train | separate_gpus | 2 | 250.00 ms | 20.8% | 500.00 ms | 0.4% |"
        in (tmp_path / "w" / "whatif.md").read_text()
    )
    warning = (
        "step 1 takes 112 s, 93× the median of the other steps (1.20 s): a warm-up or an "
        "outlier (≥ 3× the others' median) that dominates every run total here; `--steps 2` "
        "leaves it out"
    )
    assert f"warning: {warning}" in " ".join(done.output.split())
    assert f"## Warnings\n\n- {warning}" in (tmp_path / "w" / "whatif.md").read_text()

    steady = runner.invoke(app, ["whatif", str(logs), "--steps", "2", "--out", str(tmp_path / "s")])
    assert steady.exit_code == 0, steady.output
    assert "warning" not in steady.output and "--steps 2" in steady.output
    one = pl.read_csv(tmp_path / "s" / "whatif.csv").filter(pl.col("variant") == "separate_gpus")
    assert one.select("step", "bound_s", "saving_s").rows() == [(2, 1.2, 0.0)]  # nothing to overlap
    bad = runner.invoke(app, ["whatif", str(logs), "--steps", "5:", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2
    assert bad.output.strip() == (
        "error: --steps '5:' matches no step of this log (steps available: 1:2)"
    )


def test_steps_on_traces_select_before_the_pipeline(sample, tmp_path):
    root, _ = sample
    done = runner.invoke(
        app, ["whatif", str(root / "run"), "--steps", "2:", "--out", str(tmp_path / "w")]
    )
    assert done.exit_code == 0, done.output
    table = pl.read_csv(tmp_path / "w" / "whatif.csv")
    _, wall = _window(root)
    assert sorted(table["step"].unique()) == [2, 3]
    row = _row(table, "overlap_gen_train", "separate_gpus", 2)  # step 2's gen is now the fill
    rest = wall[(2, "step")] - wall[(2, "step/gen")]
    expected = wall[(2, "step/gen")] + max(wall[(3, "step/gen")], rest)
    assert row["bound_s"] == pytest.approx(expected / 1e9, abs=1e-9)


def test_the_figure_writes_the_numbers_it_draws(sample, tmp_path):
    root, _ = sample
    table = pl.read_csv(root / "w" / "whatif.csv")
    drawn = pl.read_csv(root / "w" / "figures" / "whatif_per_step.csv")
    assert drawn.columns == ["series", "x", "y", "p10", "p90"]
    step_level = table.filter(
        pl.col("bound_s").is_not_null()
        & ((pl.col("bound") != "balanced_dp") | (pl.col("variant") == "whole_step"))
    )
    measured = drawn.filter(pl.col("series") == "measured")
    per_step = step_level.group_by("step").agg(pl.col("measured_s").first()).sort("step")
    assert measured["x"].to_list() == per_step["step"].cast(pl.Float64).to_list()
    assert measured["y"].to_list() == per_step["measured_s"].to_list()
    for (bound, variant), rows in step_level.group_by("bound", "variant"):
        line = drawn.filter(pl.col("series") == f"{bound} / {variant}").sort("x")
        assert line["y"].to_list() == rows.sort("step")["bound_s"].to_list()
    assert drawn["p10"].is_null().all()  # the band is drawn for bins of steps only
    # past 40 steps: medians over bins of consecutive steps, the measured p10–p90 band
    from nvtx_phases.analysis.render.report.whatif import whatif_figure

    times = _times(
        [(s, p, v) for s in range(1, 101) for p, v in (("step", 10.0 + s % 7), ("gen", 5.0))]
    )
    long = whatif_table(_inputs(times))
    whatif_figure(long, tmp_path)
    binned = pl.read_csv(tmp_path / "whatif_per_step.csv")
    first = binned.filter((pl.col("series") == "measured") & (pl.col("x") == 2.0))
    # 100 steps in 40 bins: steps 1–3 are bin 0 (mean step 2): step times 11, 12, 13 s
    assert first.select("y", "p10", "p90").row(0) == pytest.approx((12.0, 11.2, 12.8))
    overlap = binned.filter(
        (pl.col("series") == "overlap_gen_train / separate_gpus") & (pl.col("x") == 2.0)
    )
    # bin 0's bounds: step 1: 5 (fill) + max(5, 6); steps 2, 3: max(5, 7), max(5, 8)
    assert overlap["y"].to_list() == [8.0]
