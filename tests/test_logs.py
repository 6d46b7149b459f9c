"""``nvtx-phases logs``: phase tables from VeRL's console and file-logger logs alone.

The fixtures are what VeRL 0.9.1 writes: ``console_grpo.log`` is its console logger's
``step:N - key:value`` lines (values as ``pprint.pformat`` prints them, numpy 2 scalars as
``np.float64(…)``) behind Ray's coloured ``(TaskRunner pid=…)`` prefix, among other Ray, vLLM and
progress-bar lines; ``file_logger_ppo.jsonl`` is its file logger's ``{"step": N, "data": {…}}``.
"""

from __future__ import annotations

import json
import pprint
import struct
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import WorkloadInputError
from nvtx_phases.analysis.jobs import Reporter, logs_to
from nvtx_phases.analysis.render.report.verl_logs import share_bars
from nvtx_phases.analysis.workload import verl_logs as wl
from nvtxp_testkit import brute_quantile
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data" / "verl_logs"
CONSOLE = DATA / "console_grpo.log"
JSONL = DATA / "file_logger_ppo.jsonl"
runner = CliRunner()

#: the console fixture's timers per step, in the order VeRL logs them
CONSOLE_TIMERS = {
    1: [("gen", 6.25), ("reward", 0.75), ("old_log_prob", 1.0), ("ref", 0.5), ("adv", 0.125),
        ("update_actor", 2.0), ("update_weights", 0.375), ("step", 11.5)],
    2: [("gen", 8.0), ("reward", 1.0), ("old_log_prob", 1.25), ("ref", 0.75), ("adv", 0.25),
        ("update_actor", 2.5), ("save_checkpoint", 3.0), ("update_weights", 0.25),
        ("step", 17.5)],
    3: [("gen", 7.0), ("reward", 0.5), ("old_log_prob", 1.0), ("ref", 0.5), ("adv", 0.5),
        ("update_actor", 3.0), ("update_weights", 0.5), ("step", 13.5)],
}  # fmt: skip


def _expected(timers: dict[int, list[tuple[str, float]]]) -> pl.DataFrame:
    rows = [(step, phase, seconds) for step, pairs in timers.items() for phase, seconds in pairs]
    return pl.DataFrame(rows, schema=wl.PHASE_TIMES_SCHEMA, orient="row")


def _tables(*paths: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``phase_times`` without its ``source`` column, and the steps table."""
    values = wl.latest_values(wl.read_logs(list(paths)))
    times = wl.phase_times(values)
    return times.drop("source"), wl.steps_table(values, times)


def _console_line(step: int, metrics: dict[str, object]) -> str:
    """What ``verl.utils.logger.aggregate_logger.LocalLogger`` prints."""
    return " - ".join([f"step:{step}", *(f"{k}:{pprint.pformat(v)}" for k, v in metrics.items())])


def _png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def test_console_log_phase_times_are_exact():
    times, _ = _tables(CONSOLE)
    # step 0 (validation only) is dropped; testing, start/stop_profile and agent_loop/* are not
    # phases; save_checkpoint sits where VeRL runs it, between update_actor and update_weights
    assert_frame_equal(times, _expected(CONSOLE_TIMERS))


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p10, median, p90 by linear interpolation (numpy.percentile's default), by hand."""
    return (brute_quantile(values, 0.1), brute_quantile(values, 0.5), brute_quantile(values, 0.9))


def _shares_by_hand(timers: dict[int, list[tuple[str, float]]]) -> dict[str, list[float]]:
    """Per phase (and other): its share of each step it ran in, in %."""
    shares: dict[str, list[float]] = {}
    for pairs in timers.values():
        seconds = dict(pairs)
        step = seconds.pop("step")
        for phase, value in seconds.items():
            shares.setdefault(phase, []).append(100 * value / step)
        shares.setdefault(wl.OTHER, []).append(100 * (step - sum(seconds.values())) / step)
    return shares


def test_console_log_share_is_the_median_over_steps_of_each_steps_share():
    times, _ = _tables(CONSOLE)
    summary = wl.phase_summary(times)
    assert summary["phase"].to_list() == [
        "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "save_checkpoint",
        "update_weights", wl.OTHER, "step",
    ]  # fmt: skip
    expected = _shares_by_hand(CONSOLE_TIMERS)
    for row in summary.iter_rows(named=True):
        p10, median, p90 = _percentiles(expected.get(row["phase"], [100.0]))
        got = (row["share_p10_pct"], row["share_median_pct"], row["share_p90_pct"])
        assert got == pytest.approx((p10, median, p90), rel=1e-12), row["phase"]
    share = dict(zip(summary["phase"], summary["share_median_pct"], strict=True))
    # gen: 6.25/11.5, 8/17.5, 7/13.5: the median is step 3's 51.85%, not 21.25/42.5 = 50%
    assert share["gen"] == pytest.approx(100 * 7.0 / 13.5, rel=1e-12)
    assert share["save_checkpoint"] == pytest.approx(100 * 3.0 / 17.5, rel=1e-12)  # 1 step
    assert share["step"] == 100.0
    row = summary.row(summary["phase"].to_list().index("gen"), named=True)
    assert (row["n_steps"], row["median_s"]) == (3, 7.0)
    assert row["p10_s"] == pytest.approx(6.4) and row["p90_s"] == pytest.approx(7.8)
    checkpoint = summary.row(6, named=True)
    assert (checkpoint["n_steps"], checkpoint["median_s"]) == (1, 3.0)


def test_console_log_steps_table_keeps_every_other_metric():
    _, steps = _tables(CONSOLE)
    assert steps["step"].to_list() == [1, 2, 3]
    assert steps.columns[:4] == [
        "step", "timing_per_token_ms/gen", "timing_per_token_ms/update_actor",
        "perf/mfu/actor_infer",
    ]  # fmt: skip
    assert steps["perf/throughput"].to_list() == [
        1992.3478260869565,
        1360.4571428571428,
        1654.5185185185185,
    ]
    assert steps["perf/total_num_tokens"].to_list() == [183296.0, 190464.0, 178688.0]
    assert steps["perf/mfu/actor"][0] == 0.3521063327789307
    assert steps["perf/max_memory_allocated_gb"].to_list() == [41.25, 41.5, 41.5]
    assert steps["response_length/mean"].to_list() == [612.25, 655.875, 590.5]
    assert steps["response_length/clip_ratio"].to_list() == [0.0625, 0.09375, 0.0]
    assert steps["actor/lr"][0] == 1e-06
    assert steps["critic/advantages/mean"][0] == -1.1920928955078125e-08
    # numpy 2 scalars and the timers that are not phases stay, named as logged
    assert steps["timing_s/agent_loop/generate_sequences/max"].to_list() == [6.0, 7.75, 6.75]
    assert steps["timing_s/agent_loop/num_preempted/max"].to_list() == [0.0, 0.0, 0.0]
    assert steps["timing_s/testing"].to_list() == [None, 4.75, None]
    assert not any(c.startswith(("val-", "timing_s/gen", "timing_s/step")) for c in steps.columns)
    assert steps.schema["response_length/max"] == pl.Float64


def test_file_logger_json_lines():
    times, steps = _tables(JSONL)
    common = [("reward", 1.0), ("old_log_prob", 2.0), ("ref", 1.5), ("values", 1.5), ("adv", 0.5),
              ("update_critic", 3.0)]  # fmt: skip
    assert_frame_equal(
        times,
        _expected(
            {
                1: [
                    ("gen", 10.0),
                    *common,
                    ("update_actor", 4.0),
                    ("update_weights", 0.5),
                    ("step", 25.0),
                ],
                2: [
                    ("gen", 12.0),
                    *common,
                    ("update_actor", 4.5),
                    ("update_weights", 0.5),
                    ("step", 27.0),
                ],
            }
        ),
    )
    assert steps["critic/vf_explained_var"].to_list() == [0.0625, None]  # orjson's null (NaN)
    assert steps["perf/total_num_tokens"].to_list() == [262144.0, 270336.0]
    assert steps["timing_per_token_ms/values"].to_list() == [0.0057, 0.0055]
    assert steps["perf/throughput"][1] == 1251.5555555555557
    share = dict(wl.phase_summary(times).select("phase", "share_median_pct").iter_rows())
    # the median of two steps is their mean: gen 10/25 and 12/27, other 1/25 and 0.5/27
    assert share["gen"] == pytest.approx(100 * (10 / 25 + 12 / 27) / 2, rel=1e-12)
    assert share[wl.OTHER] == pytest.approx(100 * (1 / 25 + 0.5 / 27) / 2, rel=1e-12)


def test_older_timing_form_and_timing_s_precedence(tmp_path):
    log = tmp_path / "old.log"
    log.write_text(
        "step:1 - timing/gen:5.0 - timing/ref:1.0 - timing/update_actor:2.0 - timing/step:9.0 - "
        "timing_per_token/gen:0.01 - response_length/mean:100.0\n"
        "step:2 - timing/gen:6.0 - timing_s/gen:6.5 - timing/step:10.0\n"
    )
    times, steps = _tables(log)
    assert_frame_equal(
        times,
        _expected(
            {
                1: [("gen", 5.0), ("ref", 1.0), ("update_actor", 2.0), ("step", 9.0)],
                2: [("gen", 6.5), ("step", 10.0)],
            }
        ),
    )
    assert steps.columns == ["step", "response_length/mean", "timing_per_token/gen"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("41.28733241604641", 41.28733241604641),
        ("183296", 183296.0),
        ("1e-06", 1e-06),
        ("-2.5E+3", -2500.0),
        ("np.float64(3.5)", 3.5),
        ("np.int64(0)", 0.0),
        ("np.float32(0.25)", 0.25),
        ("True", 1.0),
        ("inf", float("inf")),
    ],
)
def test_console_values_as_pprint_prints_them(text, value):
    assert wl.parse_value(text) == (True, value)


@pytest.mark.parametrize("text", ["nan", "np.float64(nan)"])
def test_nan_becomes_null(text):
    assert wl.parse_value(text) == (True, None)


def test_console_lines_with_prefixes_and_noise():
    ip = "\x1b[36m(TaskRunner pid=7, ip=10.0.0.2)\x1b[0m step:4 - a/b:1.5 - c:np.float64(2.0)"
    assert wl.parse_console_line(ip) == (4, [("a/b", 1.5), ("c", 2.0)])
    repeated = "(TaskRunner pid=7) step:5 - x:1 [repeated 2x across cluster]"
    assert wl.parse_console_line(repeated) == (5, [("x", 1.0)])
    assert wl.parse_console_line("step:6 - bad:[1, 2] - ok:3") == (6, [("ok", 3.0)])
    assert wl.parse_console_line("training/global_step:3 - timing_s/gen:1.0") is None
    assert wl.parse_console_line("Training Progress: 33%|███▎ | 1/3") is None
    assert wl.parse_json_line('{"step": true, "data": {"timing_s/gen": 1}}') is None
    assert wl.parse_json_line('{"step": 2, "timing_s/gen": 1.5, "note": "x"}') == (
        2,
        [("timing_s/gen", 1.5)],
    )


def test_a_log_without_timers_is_a_named_one_line_error(tmp_path):
    log = tmp_path / "no_timers.log"
    log.write_text("(TaskRunner pid=1) step:1 - actor/pg_loss:0.5 - perf/throughput:10.0\n")
    with pytest.raises(WorkloadInputError, match=r"no_timers\.log: no VeRL step timers") as info:
        wl.read_logs([CONSOLE, log])
    assert "timing_s/<stage>" in str(info.value) and "\n" not in str(info.value)
    result = runner.invoke(app, ["logs", str(log), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "error:" in result.output and "timing_s/<stage>" in result.output
    assert not (tmp_path / "out").exists()


def test_resumed_run_later_file_wins_whole_step(tmp_path):
    first, second = tmp_path / "seg1.log", tmp_path / "seg2.log"
    first.write_text(
        "\n".join(
            _console_line(
                s,
                {
                    "timing_s/gen": 1.0 * s,
                    "timing_s/save_checkpoint": 0.5,
                    "timing_s/step": 2.0 * s,
                    "perf/throughput": 100.0,
                },
            )
            for s in (1, 2, 3)
        )
    )
    second.write_text(
        _console_line(3, {"val-core/acc/mean@1": 0.5})  # the resumed run's first validation
        + "\n"
        + "\n".join(
            _console_line(s, {"timing_s/gen": 10.0 * s, "timing_s/step": 20.0 * s})
            for s in (3, 4, 4)  # step 4 printed twice: its last values count
        )
    )
    notes: list[str] = []
    done = logs_to([first, second], tmp_path / "out", reporter=Reporter(note=notes.append))
    assert_frame_equal(
        done.phase_times.drop("source"),
        _expected(
            {
                1: [("gen", 1.0), ("save_checkpoint", 0.5), ("step", 2.0)],
                2: [("gen", 2.0), ("save_checkpoint", 0.5), ("step", 4.0)],
                3: [("gen", 30.0), ("step", 60.0)],  # seg2's step 3, nothing kept from seg1's
                4: [("gen", 40.0), ("step", 80.0)],
            }
        ),
    )
    assert done.steps["perf/throughput"].to_list() == [100.0, 100.0, None, None]
    assert any("more than once" in n and "3, 4" in n for n in notes)


def test_nested_timers_are_noted_and_other_is_never_negative(tmp_path):
    log = tmp_path / "nested.log"
    log.write_text("step:1 - timing_s/gen:5.0 - timing_s/my_stage:4.0 - timing_s/step:8.0\n")
    notes: list[str] = []
    done = logs_to([log], tmp_path / "out", reporter=Reporter(note=notes.append))
    other = done.summary.filter(pl.col("phase") == wl.OTHER)
    assert other["median_s"].to_list() == [0.0]
    assert any("more than timing_s/step" in n for n in notes)


def test_cli_end_to_end_and_the_figure_size_does_not_grow(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["logs", str(CONSOLE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "VeRL phase times: 3 steps (1–3)" in result.output
    gen = _percentiles(_shares_by_hand(CONSOLE_TIMERS)["gen"])
    gen_text = [f"{v:.1f}%" for v in gen]  # 46.9%, 51.9%, 53.8%
    assert "share of step (median over steps)" in result.output
    assert gen_text[1] in result.output and "other (not timed)" in result.output
    times = pl.read_csv(out / "phase_times.csv", schema=wl.PHASE_TIMES_COLUMNS)
    assert_frame_equal(times.drop("source"), _expected(CONSOLE_TIMERS))
    assert times["source"].to_list() == [f"timing_s/{p}" for p in times["phase"]]
    assert pl.read_csv(out / "steps.csv")["perf/throughput"][0] == 1992.3478260869565
    row = f"| gen | 3 | 7.000 | 6.400–7.800 | {gen_text[1]} | {gen_text[0]}–{gen_text[2]} |"
    assert row in (out / "phase_summary.md").read_text()
    small = _png_size(out / "figures" / "phase_share.png")
    assert (out / "figures" / "phase_share.svg").stat().st_size > 10_000

    long = tmp_path / "long.jsonl"
    long.write_text(
        "\n".join(
            f'{{"step": {s}, "data": {{"timing_s/gen": {5 + s % 7}, "timing_s/update_actor": 2.0, '
            f'"timing_s/step": {8 + s % 7}, "perf/throughput": {1000 + s}}}}}'
            for s in range(1, 201)
        )
    )
    big = runner.invoke(app, ["logs", str(long), "--out", str(tmp_path / "long")])
    assert big.exit_code == 0, big.output
    assert _png_size(tmp_path / "long" / "figures" / "phase_share.png") == small == (2000, 1000)
    shares, bars = share_bars(wl.phase_times(wl.latest_values(wl.read_logs([long]))))
    assert bars.height == 40 and bars["n_steps"].to_list() == [5] * 40
    assert bars["label"][0] == "1–5"
    per_bar = shares.group_by("bar").agg(pl.col("share").sum())["share"]
    assert per_bar.to_list() == pytest.approx([1.0] * 40, rel=1e-12)
    drawn = pl.read_csv(tmp_path / "long" / "figures" / "phase_share.csv")  # binned: whiskers
    assert drawn["bar"].n_unique() == 40
    first = drawn.filter(pl.col("bar") == 0)  # steps 1–5: step times 9, 10, 11, 12, 13 s
    assert first["step_s"].unique().to_list() == [11.0]
    assert first["step_p10_s"].unique().to_list() == pytest.approx([9.4])
    assert first["step_p90_s"].unique().to_list() == pytest.approx([12.6])
    # a bin's bar: the mean of its steps' shares (each step's share is the definition)
    bin_gen = first.filter(pl.col("phase") == "gen")["share_pct"].item()
    per_step = [100 * (5 + s % 7) / (8 + s % 7) for s in range(1, 6)]
    assert bin_gen == pytest.approx(sum(per_step) / 5, rel=1e-12)


# --- VeRL 0.1: timing/<stage> keys and no step timer -------------------------------------------

#: a real GPU run's first two steps as VeRL 0.1's quickstart shows them (docs/start/quickstart.rst
#: at tag v0.1): the keys in the order its ray_trainer.fit logged them, a few other metrics kept
QUICKSTART = {
    0: {"timing/gen": 21.470, "timing/ref": 4.360, "timing/values": 5.800,
        "actor/reward_kl_penalty": 0.000, "timing/adv": 0.109, "timing/update_critic": 15.664,
        "critic/vf_loss": 14.947, "critic/lr(1e-4)": 0.100, "timing/update_actor": 20.314,
        "actor/pg_loss": -0.005, "critic/score/mean": 0.004, "response_length/mean": 239.133},
    1: {"timing/gen": 23.020, "timing/ref": 4.322, "timing/values": 5.953,
        "actor/reward_kl_penalty": 0.000, "timing/adv": 0.118, "timing/update_critic": 15.646,
        "critic/vf_loss": 18.472, "critic/lr(1e-4)": 0.100, "timing/update_actor": 20.526,
        "actor/pg_loss": 0.000, "critic/score/mean": 0.000, "response_length/mean": 232.242},
}  # fmt: skip


def _v01_line(step: int, metrics: dict[str, float]) -> str:
    """What VeRL 0.1's console logger printed: ``concat_dict_to_str`` in
    verl/utils/logger/aggregate_logger.py at tag v0.1, ``f'{k}:{v:.3f}'`` per number."""
    return " - ".join([f"step:{step}", *(f"{k}:{v:.3f}" for k, v in metrics.items())])


def _v01_log(tmp_path: Path) -> Path:
    log = tmp_path / "verl_demo.log"
    lines = [f"(main_task pid=2741) {_v01_line(s, m)}" for s, m in QUICKSTART.items()]
    log.write_text(
        "Using LocalLogger is deprecated. The constructor API will change \n"
        + "\n".join(lines)
        + "\n"
    )
    return log


def _timers_by_hand(metrics: dict[str, float]) -> dict[str, float]:
    """The stage timers of one step, as printed (3 decimals), parsed without the module."""
    return {
        k.split("/", 1)[1]: float(f"{v:.3f}") for k, v in metrics.items() if k.startswith("timing/")
    }


def test_verl_01_log_gets_a_step_row_summed_from_its_stage_timers(tmp_path):
    notes: list[str] = []
    done = logs_to([_v01_log(tmp_path)], tmp_path / "out", reporter=Reporter(note=notes.append))
    written = pl.read_csv(tmp_path / "out" / "phase_times.csv", schema=wl.PHASE_TIMES_COLUMNS)
    assert_frame_equal(written, done.phase_times)
    for step, metrics in QUICKSTART.items():
        timers = _timers_by_hand(metrics)
        rows = written.filter(pl.col("step") == step)
        stages = rows.filter(pl.col("phase") != "step")
        assert dict(zip(stages["phase"], stages["seconds"], strict=True)) == timers
        assert stages["source"].to_list() == [f"timing/{p}" for p in timers]
        whole = rows.filter(pl.col("phase") == "step").row(0, named=True)
        assert whole["seconds"] == pytest.approx(sum(timers.values()), rel=1e-12)
        assert whole["source"] == wl.SUMMED == "sum of stage timers"
    assert rows["phase"].to_list()[-1] == "step"  # the step row last, as with a step timer
    assert any("no step timer" in n and "steps 0, 1" in n for n in notes)
    # the time between stages is not seen: no "other (not timed)" row, no 0 pretending to be one
    assert wl.OTHER not in done.summary["phase"].to_list()
    assert "Note: no step timer" in (tmp_path / "out" / "phase_summary.md").read_text()
    assert "critic/lr(1e-4)" in done.steps.columns


def test_verl_01_log_then_whatif(tmp_path):
    # before: "error: …/phase_times.csv: no rows of phase 'step' (the step's own time)"
    logs = tmp_path / "logs"
    assert runner.invoke(app, ["logs", str(_v01_log(tmp_path)), "--out", str(logs)]).exit_code == 0
    done = runner.invoke(
        app, ["whatif", str(logs), "--out", str(tmp_path / "w")], terminal_width=200
    )
    assert done.exit_code == 0, done.output
    assert "no step timer in steps 0:1" in done.output
    table = pl.read_csv(tmp_path / "w" / "whatif.csv")
    (g0, s0), (g1, s1) = (
        (t["gen"], sum(t.values())) for t in map(_timers_by_hand, QUICKSTART.values())
    )
    overlap = table.filter(
        (pl.col("bound") == "overlap_gen_train") & (pl.col("variant") == "separate_gpus")
    )
    # the pipeline: step 0's gen alone, step 0's rest beside step 1's gen, step 1's rest alone
    assert overlap["bound_s"].sum() == pytest.approx(g0 + max(g1, s0 - g0) + (s1 - g1), abs=1e-9)
    gaps = table.filter(pl.col("bound") == "no_transitions")
    assert gaps["bound_s"].is_null().all()
    assert gaps["assumption"].str.starts_with("not available: no step timer logged").all()


@pytest.mark.parametrize("flat", [False, True])
def test_json_lines_with_timing_keys_get_a_step_row_and_a_whatif(tmp_path, flat):
    log = tmp_path / "old.jsonl"
    records = [
        {"timing/gen": 4.0, "timing/update_actor": 2.5},
        {"timing/gen": 3.0, "timing/update_actor": 2.0},
    ]
    log.write_text(
        "\n".join(
            json.dumps({"step": s, **r} if flat else {"step": s, "data": r})
            for s, r in enumerate(records, start=1)
        )
    )
    logs = tmp_path / "logs"
    assert runner.invoke(app, ["logs", str(log), "--out", str(logs)]).exit_code == 0
    times = pl.read_csv(logs / "phase_times.csv", schema=wl.PHASE_TIMES_COLUMNS)
    steps = times.filter(pl.col("phase") == "step")
    assert steps.rows() == [(1, "step", 6.5, wl.SUMMED), (2, "step", 5.0, wl.SUMMED)]
    done = runner.invoke(app, ["whatif", str(logs), "--out", str(tmp_path / "w")])
    assert done.exit_code == 0, done.output
    table = pl.read_csv(tmp_path / "w" / "whatif.csv").filter(pl.col("variant") == "separate_gpus")
    assert table["bound_s"].to_list() == [4.0 + max(3.0, 2.5), 2.0]


@pytest.mark.parametrize("fixture", [CONSOLE, JSONL])
def test_timing_s_logs_keep_their_step_timer_and_give_a_whatif(tmp_path, fixture):
    logs = tmp_path / "logs"
    assert runner.invoke(app, ["logs", str(fixture), "--out", str(logs)]).exit_code == 0
    times = pl.read_csv(logs / "phase_times.csv", schema=wl.PHASE_TIMES_COLUMNS)
    steps = times.filter(pl.col("phase") == "step")
    assert steps["source"].to_list() == ["timing_s/step"] * steps.height
    done = runner.invoke(app, ["whatif", str(logs), "--out", str(tmp_path / "w")])
    assert done.exit_code == 0, done.output
    table = pl.read_csv(tmp_path / "w" / "whatif.csv")
    assert table.filter(pl.col("variant") == "separate_gpus")["bound_s"].null_count() == 0


def test_share_figure_writes_the_numbers_it_draws(tmp_path):
    out = tmp_path / "out"
    assert runner.invoke(app, ["logs", str(CONSOLE), "--out", str(out)]).exit_code == 0
    drawn = pl.read_csv(out / "figures" / "phase_share.csv", schema_overrides={"label": pl.String})
    assert drawn.columns == [
        "bar", "label", "n_steps", "phase", "share_pct", "step_s", "step_p10_s", "step_p90_s",
    ]  # fmt: skip
    for step, timers in CONSOLE_TIMERS.items():  # one bar per step: its timers over its step
        seconds = dict(timers)
        bar = drawn.filter(pl.col("label") == str(step))
        heights = dict(zip(bar["phase"], bar["share_pct"], strict=True))
        for phase, value in seconds.items():
            if phase != "step":
                assert heights[phase] == pytest.approx(100 * value / seconds["step"], rel=1e-12)
        assert heights.get("save_checkpoint", 0.0) == (100 * 3.0 / 17.5 if step == 2 else 0.0)
        timed = sum(v for k, v in seconds.items() if k != "step")
        assert heights[wl.OTHER] == pytest.approx(100 * (seconds["step"] - timed) / seconds["step"])
        assert sum(heights.values()) == pytest.approx(100.0, rel=1e-12)
        assert bar["step_s"].unique().to_list() == [seconds["step"]]
    assert drawn["step_p10_s"].is_null().all()  # whiskers only for bins of steps
