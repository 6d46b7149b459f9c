"""Response lengths, stragglers, fits and fidelity, on small hand-made data with exact answers."""

import json

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtx_phases.analysis.workload.fidelity import compare_with_log, read_verl_log
from nvtx_phases.analysis.workload.lengths import (
    drift,
    length_stats,
    rank_imbalance,
    read_packed_lengths,
    read_reward_timings,
)
from nvtx_phases.analysis.workload.stragglers import generation_tails
from nvtxp_testkit import SHARED
from typer.testing import CliRunner


def write_step(folder, step, rows):
    lines = [
        json.dumps(
            {
                "step": step,
                "rank": r,
                "dp_rank": r,
                "tp_rank": 0,
                "local_index": i,
                "input": inp,
                "output": out,
                "n_sampling": len(out),
                "validate": False,
            }
        )
        for i, (r, inp, out) in enumerate(rows)
    ]
    (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def small(tmp_path):
    write_step(tmp_path, 1, [(0, 10, [10, 20, 30, 40]), (1, 12, [50, 100, 100, 650])])
    write_step(tmp_path, 2, [(0, 10, [100, 100]), (1, 10, [100, 100])])
    (tmp_path / "reward_timings_step_1.jsonl").write_text(
        '{"step": 1, "rank": 0, "tp_rank": 0, "dp_rank": 0, "reward_time_s": 2.0, "response_sum": 100, "response_mean": 25.0, "response_max": 40, "validate": false}\n'
        '{"step": 1, "rank": 1, "tp_rank": 0, "dp_rank": 1, "reward_time_s": 6.0, "response_sum": 900, "response_mean": 225.0, "response_max": 650, "validate": false}\n'
    )
    return tmp_path


def test_exact_statistics(small):
    responses = read_packed_lengths([small])
    assert responses.height == 12
    stats = length_stats(responses, cap=650)
    one = stats.row(0, named=True)
    values = np.array([10, 20, 30, 40, 50, 100, 100, 650], dtype=float)
    assert one["n_responses"] == 8
    assert one["mean"] == values.mean() == 125.0
    assert one["p50"] == np.percentile(values, 50) == 45.0
    assert one["p90"] == pytest.approx(np.percentile(values, 90)) == pytest.approx(265.0)
    assert one["max"] == 650 and one["max_over_mean"] == 5.2
    assert one["cv"] == pytest.approx(values.std() / values.mean())
    assert one["frac_at_cap"] == 1 / 8
    two = stats.row(1, named=True)
    assert (two["mean"], two["cv"], two["max_over_mean"]) == (100.0, 0.0, 1.0)
    trend = drift(stats).filter(pl.col("statistic") == "mean").row(0, named=True)
    assert trend["change_pct"] == -20.0 and trend["slope_per_step"] == -25.0
    imbalance = rank_imbalance(responses, read_reward_timings([small]))
    # step 1: tokens 100 vs 900 → max/mean 1.8; reward time 6 vs 2 → 1.5
    assert imbalance.row(0, named=True)["tokens_max_over_mean"] == 1.8
    assert imbalance.row(0, named=True)["reward_time_max_over_mean"] == 1.5


def test_polytrace_published_traces_import_as_they_are():
    folder = SHARED / "polytrace" / "verl-video"
    if not folder.exists():
        pytest.skip("../shared/polytrace not present")
    responses = read_packed_lengths([folder])
    assert responses.height == 21 * 64 * 8
    stats = length_stats(responses, cap=16000)
    last = stats.filter(pl.col("step") == 21).row(0, named=True)
    assert last["max"] == 16000
    assert last["frac_at_cap"] == 2 / 512


def test_fit_sample_round_trip_accepts_itself_and_rejects_a_shift(tmp_path):
    from nvtx_phases.analysis.workload.fits import (
        fit_task,
        ks_two_sample,
        parameter_file,
        write_sampled_steps,
    )

    rng = np.random.default_rng(1)
    n = 4000  # prompts of two kinds: short answers and long reasoning
    kind = rng.random(n) < 0.6
    inputs = np.where(kind, rng.normal(300, 30, n), rng.normal(900, 80, n)).round()
    outputs = np.where(kind, rng.normal(400, 60, n), rng.normal(2000, 300, n)).round()
    frame = pl.DataFrame(
        {
            "step": [1] * n,
            "input_len": inputs.astype(int),
            "output_len": outputs.astype(int),
            "validate": [False] * n,
        }
    )
    task = fit_task(frame, "math")
    assert task["joint_distribution"]["n_components"] >= 2
    params = parameter_file({"math": task}, "test")
    assert set(params) == {"version", "extraction_info", "math_task"}
    files = write_sampled_steps(task, tmp_path, steps=2, prompts=500, n_sampling=4, seed=7)
    sampled = read_packed_lengths(files)["output_len"].to_numpy()
    _, p_same = ks_two_sample(outputs, sampled)
    _, p_shift = ks_two_sample(outputs * 1.3, sampled)
    assert p_same > 0.05
    assert p_shift < 1e-6


def test_straggler_idle_tails_equal_the_known_rank_end_times(tmp_path):
    path = generate(
        tmp_path / "run.sqlite", SynthConfig(steps=2, ranks=3, kernels_per_phase=8, length_skew=0.5)
    )[0]
    truth = json.loads(path.with_name("run.ground_truth.json").read_text())
    tails = generation_tails(analyze([path]))
    gen = pl.DataFrame(truth["worker_phases"]).filter(pl.col("phase") == "generate_sequences")
    expected = gen.with_columns(
        (pl.col("end_ns").max().over("step") - pl.col("end_ns")).alias("tail")
    ).sort("step", "pid")
    assert (
        tails.select("step", "pid", "idle_tail_ns").rows()
        == expected.select("step", "pid", "tail").rows()
    )
    # rank 0 generates longest (skew); it is the straggler, its tail is 0
    assert tails.filter(pl.col("is_straggler"))["pid"].unique().to_list() == [2000]
    assert tails["idle_tail_energy_j"].null_count() == 0
    # with power: the waiting GPU draws idle power (90 W) for its tail, give or take the
    # sampled straddle at the generation end
    rank2 = tails.filter(pl.col("pid") == 2002)
    assert (rank2["idle_tail_energy_j"] - 90.0 * rank2["idle_tail_ns"] / 1e9).abs().max() < 0.01


def test_fidelity_against_a_verl_log_with_known_offsets(tmp_path):
    path = generate(tmp_path / "run.sqlite", SynthConfig(steps=3, ranks=1, kernels_per_phase=4))[0]
    result = analyze([path])
    window = result.phases.filter(pl.col("attribution") == "window")
    trace_s = {(r["step"], r["path"]): r["wall_ns"] / 1e9 for r in window.iter_rows(named=True)}
    offsets = {"gen": 0.10, "old_log_prob": -0.05, "update_actor": 0.02, "step": 0.0}
    console = tmp_path / "verl.log"
    jsonl = tmp_path / "verl.jsonl"
    lines, records = [], []
    for step in (1, 2, 3):
        metrics = {
            f"timing_s/{s}": trace_s[(step, "step" if s == "step" else f"step/{s}")] * (1 + k)
            for s, k in offsets.items()
        }
        metrics["actor/entropy"] = 0.5
        lines.append(
            f"(TaskRunner pid=77) step:{step} - "
            + " - ".join(f"{k}:{v!r}" for k, v in metrics.items())
        )
        records.append(json.dumps({"step": step, "data": metrics}))
    console.write_text("noise line\n" + "\n".join(lines) + "\n")
    jsonl.write_text("\n".join(records) + "\n")
    # an older VeRL (timing/ keys) printing through Ray's coloured prefix
    old = tmp_path / "verl_old.log"
    old.write_text(
        "".join(
            "\x1b[36m(main_task pid=77)\x1b[0m "
            + line.split(") ", 1)[1].replace("timing_s/", "timing/")
            + "\n"
            for line in lines
        )
    )
    for log in (console, jsonl, old):
        per_step, summary = compare_with_log(result, read_verl_log(log))
        assert per_step.height == 12
        for stage, k in offsets.items():
            expected = (1 / (1 + k) - 1) * 100
            assert summary["stages"][stage]["mean_error_pct"] == pytest.approx(expected, abs=1e-9)
        mean_abs = np.mean([abs(1 / (1 + k) - 1) * 100 for k in offsets.values()])
        assert summary["overall_accuracy_pct"] == pytest.approx(100 - mean_abs, abs=1e-9)


def test_verl_console_log_with_ray_colours_and_old_timing_keys(tmp_path):
    from nvtx_phases.analysis.workload.fidelity import logged_stage_times

    log = tmp_path / "verl.log"
    log.write_bytes(
        # what a terminal capture of a Ray run holds: coloured prefixes, progress bars, \r
        b"\x1b[36m(TaskRunner pid=1234)\x1b[0m Training Progress:  10%|\xe2\x96\x88 | 1/10 [00:12<01:48, 12.03s/it]\r\n"
        b"\x1b[36m(TaskRunner pid=1234)\x1b[0m step:1 - global_seqlen/min:5123 - "
        b"actor/entropy:np.float64(0.612) - timing_s/gen:1.23 - timing_s/reward:0.456 - "
        b"timing_s/old_log_prob:0.5 - timing_s/update_actor:2.5 - timing_s/step:5.125 - "
        b"timing_per_token_ms/gen:0.0123 - perf/throughput:1234.5\x1b[0m\r\n"
        b"\x1b[36m(TaskRunner pid=1234)\x1b[0m step:2 - timing_s/gen:np.float64(1.5) - "
        b"timing_s/step:6.0 - critic/score/mean:-0.25\n"
        # VeRL before timing_s/: the same timers (seconds) under timing/
        b"(main_task pid=99) step:3 - timing/gen:2.25 - timing/ref:0.75 - timing/step:7.5e+00 - "
        b"response_length/mean:812.3\n"
        # a step logged under both names: timing_s/ wins
        b"(main_task pid=99) step:4 - timing/gen:9.0 - timing_s/gen:3.0\n"
        b'{"step": "5", "data": {"timing_s/gen": 1.0}}\n'  # not VeRL's file logger: skipped
    )
    metrics = read_verl_log(log)
    assert metrics.filter(pl.col("step") == 1).rows() == [
        (1, "global_seqlen/min", 5123.0),
        (1, "actor/entropy", 0.612),
        (1, "timing_s/gen", 1.23),
        (1, "timing_s/reward", 0.456),
        (1, "timing_s/old_log_prob", 0.5),
        (1, "timing_s/update_actor", 2.5),
        (1, "timing_s/step", 5.125),
        (1, "timing_per_token_ms/gen", 0.0123),
        (1, "perf/throughput", 1234.5),
    ]
    assert metrics["step"].unique().sort().to_list() == [1, 2, 3, 4]
    assert logged_stage_times(metrics).sort("step", "stage").rows() == [
        (1, "gen", 1.23),
        (1, "old_log_prob", 0.5),
        (1, "reward", 0.456),
        (1, "step", 5.125),
        (1, "update_actor", 2.5),
        (2, "gen", 1.5),
        (2, "step", 6.0),
        (3, "gen", 2.25),
        (3, "ref", 0.75),
        (3, "step", 7.5),
        (4, "gen", 3.0),
    ]


def test_lengths_and_fidelity_commands(small, tmp_path):
    runner = CliRunner()
    out = tmp_path / "len"
    result = runner.invoke(
        app, ["lengths", "analyze", str(small), "--out", str(out), "--cap", "650", "--no-fit"]
    )
    assert result.exit_code == 0, result.output
    assert pl.read_csv(out / "length_stats.csv")["frac_at_cap"].to_list() == [0.125, 0.0]
    assert (out / "figures" / "length_cdf.png").exists() and (
        out / "figures" / "length_heatmap.png"
    ).exists()
    result = runner.invoke(app, ["lengths", "analyze", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no packed_lengths_step_*.jsonl" in result.output
    bad = tmp_path / "verl.log"
    bad.write_text("nothing useful\n")
    result = runner.invoke(app, ["fidelity", str(tmp_path), "--log", str(bad)])
    assert result.exit_code == 2


def test_energy_per_generated_token(tmp_path):
    from nvtx_phases.analysis.workload.token_energy import energy_per_token
    from nvtx_phases.analysis.workload.tokens import step_tokens_from_lengths

    path = generate(tmp_path / "run.sqlite", SynthConfig(steps=2, ranks=2, kernels_per_phase=4))[0]
    result = analyze([path])
    responses = read_packed_lengths([tmp_path / "run_lengths"])
    stats = length_stats(responses)
    table = energy_per_token(result, step_tokens_from_lengths(responses))
    gen = result.phases.filter(pl.col("path") == "step/gen").sort("step")["energy_j"]
    assert table["tokens"].to_list() == stats["tokens"].to_list()
    assert (table["gen_energy_j"] - gen).abs().max() < 1e-12
    assert (table["gen_j_per_token"] - gen / stats["tokens"]).abs().max() < 1e-15
    no_power = energy_per_token(
        analyze([path], power_files=[]), step_tokens_from_lengths(responses)
    )
    assert no_power["gen_j_per_token"].null_count() == 2  # null, not zero, without power


def test_reward_timings_written_from_recorded_lengths(tmp_path):
    from nvtx_phases.lengths_record import write_reward_timings

    write_step(tmp_path, 4, [(0, 10, [10, 30]), (1, 12, [100, 300])])
    path = write_reward_timings(tmp_path, 4, 2.5)
    rewards = read_reward_timings([path])
    assert rewards.select("rank", "reward_time_s", "response_sum", "response_max").rows() == [
        (0, 2.5, 40, 30),
        (1, 2.5, 400, 300),
    ]


def test_cap_inferred_only_from_a_pile_up_at_the_longest_length(tmp_path):
    from nvtx_phases.analysis.workload.lengths import resolve_cap

    # 100 responses, 2 at the longest (2%): a cap; validation rollouts are not counted
    write_step(tmp_path, 1, [(0, 10, [*range(1, 99), 500, 500])])
    with (tmp_path / "packed_lengths_step_1.jsonl").open("a") as file:
        file.write(
            '{"step": 1, "rank": 0, "dp_rank": 0, "input": 5, "output": [900, 900], '
            '"validate": true}\n'
        )
    rows = read_packed_lengths([tmp_path])
    choice = resolve_cap(rows)
    assert (choice.value, choice.source, choice.n_at_longest, choice.n_responses) == (
        500,
        "inferred",
        2,
        100,
    )
    assert choice.text() == "cap 500 (inferred: 2.0% of responses at the maximum)"
    stats = length_stats(rows)
    assert stats.select("frac_at_cap", "cap", "cap_source").row(0) == (
        0.02,
        500,
        "inferred: 2.0% of responses at the maximum",
    )
    # an explicit cap wins, even one no response reaches
    assert length_stats(rows, cap=600).select("frac_at_cap", "cap", "cap_source").row(0) == (
        0.0,
        600,
        "given",
    )
    # one response at the longest is chance, even where it is 2% of 50
    write_step(tmp_path, 1, [(0, 10, [*range(1, 50), 500])])
    choice = resolve_cap(read_packed_lengths([tmp_path]))
    assert choice.value is None and choice.n_at_longest == 1
    assert length_stats(read_packed_lengths([tmp_path]))["frac_at_cap"].to_list() == [None]
    # 1 at the longest of 200 (0.5%) after 2 of 200 below it: no cap either
    write_step(tmp_path, 1, [(0, 10, [*range(1, 198), 400, 400, 401])])
    assert resolve_cap(read_packed_lengths([tmp_path])).value is None
