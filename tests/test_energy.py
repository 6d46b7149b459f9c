"""Energy per phase against the synthetic run's exact power model."""

import json
import shutil

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.hierarchy import build_hierarchy
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.energy import balance, samples
from nvtx_phases.analysis.energy import phases as energy
from nvtx_phases.analysis.energy.samples import (
    AVERAGED_POWER_WARNING,
    PowerData,
    align,
    cumulative_energy,
    load_samples,
)
from nvtx_phases.analysis.run.load import load_trace
from nvtx_phases.analysis.run.pipeline import analyze, device_aliases
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

CFG = SynthConfig(steps=3, ranks=2, kernels_per_phase=16, seed=5)


def _truth(path):
    return json.loads(path.with_name(path.stem + ".ground_truth.json").read_text())["energy"]


def _against_truth(result, truth) -> pl.DataFrame:
    got = result.phases.filter(pl.col("attribution") == "window").select(
        "step", "path", "wall_ns", "energy_j", "energy_samples", "below_sampling_interval"
    )
    expected = pl.DataFrame(truth["driver_phases"]).select(
        "step", "path", pl.col("energy_j").alias("truth_j")
    )
    return got.join(expected, on=["step", "path"]).with_columns(
        ((pl.col("energy_j") - pl.col("truth_j")).abs() / pl.col("truth_j")).alias("rel_error")
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = generate(tmp_path_factory.mktemp("energy") / "run.sqlite", CFG)[0]
    return path, analyze([path]), _truth(path)


def test_energy_per_phase_within_one_percent_and_conserved(run):
    _, result, truth = run
    rows = _against_truth(result, truth)
    assert rows.height == 3 * 8
    assert rows["rel_error"].max() < 0.01
    s = result.summary.to_dict()
    assert s["power_source"] == "nvml-counter"
    assert AVERAGED_POWER_WARNING not in result.warnings
    # the counter is read in whole mJ: totals agree to well under a mJ per sample read
    assert s["total_energy_j"] == pytest.approx(truth["total_energy_j"], abs=0.002)
    assert s["attributed_energy_j"] == pytest.approx(truth["attributed_energy_j"], abs=0.002)
    assert s["attributed_energy_j"] + s["unattributed_energy_j"] == pytest.approx(
        s["total_energy_j"], rel=1e-12
    )


def test_clock_marks_recover_the_sampler_clock_offset(run):
    _, result, _ = run
    (alignment,) = result.summary.to_dict()["power_alignment"]
    assert alignment["method"] == "clock marks"
    assert alignment["offset_ns"] == -CFG.power_mono_offset_ns
    assert alignment["spread_ns"] == 0
    assert alignment["n_marks"] == 11


def test_idle_baseline_above_idle_and_transition_energy(run):
    _, result, _ = run
    assert result.summary.to_dict()["idle_power_w"] == {"run:0": 90.0, "run:1": 90.0}
    window = result.phases.filter(pl.col("attribution") == "window")
    expected_above = window["energy_j"] - 90.0 * 2 * window["wall_ns"] / 1e9
    assert (window["energy_above_idle_j"] - expected_above).abs().max() < 1e-9
    # GPU-free phases draw idle power only
    assert window.filter(pl.col("path") == "step/adv")["energy_above_idle_j"].abs().max() < 1e-6
    steps = window.filter(pl.col("path") == "step").sort("step")
    children = (
        window.filter(pl.col("level") == 1)
        .group_by("step")
        .agg(pl.col("energy_j").sum())
        .sort("step")
    )
    assert (steps["gap_energy_j"] - (steps["energy_j"] - children["energy_j"])).abs().max() < 1e-9


def test_projection_rows_count_their_own_gpu(run):
    _, result, _ = run
    rows = result.phases.filter(pl.col("attribution") == "projection")
    assert rows["energy_j"].null_count() == 0
    per_device = (
        result.phase_devices.filter(pl.col("path") == "step/gen")
        .group_by("device")
        .agg(pl.col("energy_j").sum())
    )
    gen_rank0 = rows.filter((pl.col("phase") == "generate_sequences") & (pl.col("pid") == 2000))[
        "energy_j"
    ].sum()
    # the worker range lies inside gen: its GPU's energy is at most that GPU's energy in gen
    assert 0 < gen_rank0 <= per_device.filter(pl.col("device") == "run:0")["energy_j"].item()


def test_split_files_align_power_like_the_combined_file(tmp_path):
    cfg = SynthConfig(**{**CFG.__dict__, "split_files": True})
    split = analyze(generate(tmp_path / "split", cfg))
    one = analyze(generate(tmp_path / "one.sqlite", CFG))
    cols = ["step", "path", "energy_j"]
    a = split.phases.filter(pl.col("attribution") == "window").select(cols).sort("step", "path")
    b = one.phases.filter(pl.col("attribution") == "window").select(cols).sort("step", "path")
    assert (a["energy_j"] - b["energy_j"]).abs().max() < 1e-9


def test_power_only_samples_use_trapezoids(run, tmp_path):
    path, _, truth = run
    copy = tmp_path / "run.sqlite"
    shutil.copy(path, copy)
    samples = pl.read_parquet(path.with_name("run.power.parquet"))
    samples.with_columns(pl.lit(None, dtype=pl.Int64).alias("energy_mj")).write_parquet(
        tmp_path / "run.power.parquet"
    )
    result = analyze([copy])
    assert result.summary.to_dict()["power_source"] == "nvml-power"
    assert AVERAGED_POWER_WARNING in result.warnings
    # instantaneous samples miss each power step by up to ΔP·Δt/2 (~0.5% of a 40-sample phase);
    # with 100+ samples a phase is within 1%
    rows = _against_truth(result, truth).filter(pl.col("energy_samples") >= 100)
    assert rows.height == 3 * 3  # step, gen, update_actor
    assert rows["rel_error"].max() < 0.01


def test_phases_shorter_than_the_sampling_interval_are_flagged(tmp_path):
    coarse = SynthConfig(**{**CFG.__dict__, "power_interval_ns": 2_000_000})
    path = generate(tmp_path / "coarse.sqlite", coarse)[0]
    result = analyze([path])
    flagged = result.phases.filter(pl.col("below_sampling_interval"))
    assert set(flagged["path"]) == {"step/adv"}
    assert flagged["energy_j"].null_count() == 0  # interpolated, not silently zero
    assert any("shorter than the power sampling interval (2.0 ms)" in w for w in result.warnings)


def test_without_clock_marks_wall_clock_alignment_is_warned(run, tmp_path):
    path, _, _ = run
    copy = tmp_path / "run.sqlite"
    shutil.copy(path, copy)
    shutil.copy(path.with_name("run.power.parquet"), tmp_path / "run.power.parquet")
    import sqlite3

    with sqlite3.connect(copy) as con:
        con.execute("DELETE FROM NVTX_EVENTS WHERE eventType = 34")
    result = analyze([copy])
    assert result.summary.to_dict()["power_alignment"][0]["method"] == "wall clock"
    assert any("no clock marks in the traces; aligned by wall clock" in w for w in result.warnings)


def test_without_power_energy_is_null_not_zero(run):
    path, _, _ = run
    result = analyze([path], power_files=[])
    assert result.phases["energy_j"].null_count() == result.phases.height
    assert result.summary.to_dict()["power_source"] is None


def test_report_and_compare(run, tmp_path):
    path, _, _ = run
    rm = generate(tmp_path / "rm.sqlite", SynthConfig(**{**CFG.__dict__, "reward_model": True}))[0]
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rep" / "report.html").read_text()
    # 8 trace figures (power_envelope and power_timeline_detail among them) + 3 from the length
    # records found beside the trace (run_lengths/)
    assert page.count("data:image/png;base64,") == 11
    assert "step/update_actor" in page and "energy" in page
    assert "Rollout stragglers" in page and "Response lengths per step" in page
    result = runner.invoke(
        app,
        ["compare", str(path), str(rm), "-l", "rule", "-l", "rm", "--out", str(tmp_path / "cmp")],
    )
    assert result.exit_code == 0, result.output
    table = pl.read_csv(tmp_path / "cmp" / "compare.csv")
    reward = table.filter(
        (pl.col("path") == "step/reward")
        & (pl.col("metric") == "energy_j")
        & (pl.col("run") == "rm")
    )
    # the reward model draws 280 W more per GPU while it scores: J per step go up
    assert reward["diff"].item() > 0.5
    assert (tmp_path / "cmp" / "figures" / "compare_energy_j.png").exists()


def test_report_escapes_range_names(tmp_path):
    import sqlite3

    path = generate(tmp_path / "x.sqlite", SynthConfig(steps=1, ranks=1, kernels_per_phase=2))[0]
    with sqlite3.connect(path) as con:
        con.execute(
            "UPDATE NVTX_EVENTS SET text = '<img src=x onerror=alert(1)>' WHERE text = 'update_actor'"
        )
    runner = CliRunner()
    result = runner.invoke(
        app, ["analyze", str(path), "--all-ranges", "--out", str(tmp_path / "a"), "-q"]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["report", str(tmp_path / "a"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


# --- conservation, measured three ways ----------------------------------------------------------

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
SAMPLE_RM = SAMPLES / "grpo_synthetic_rm.sqlite"
DRIVER_PID = 1000
NO_DEVICES = pl.DataFrame(schema={"rid": pl.Int64, "device": pl.String})


@pytest.fixture(scope="module")
def sample():
    """The sample run's phases (driver: window) and its power, read by the real components."""
    trace = load_trace(SAMPLE, "grpo_synthetic")
    phases = build_hierarchy(trace.ranges, default_phase_map()).phases.with_columns(
        pl.when(pl.col("pid") == DRIVER_PID)
        .then(pl.lit("window"))
        .otherwise(pl.lit("projection"))
        .alias("attribution")
    )

    def power_of(name: str) -> PowerData:
        return align(
            load_samples([SAMPLES / name]),
            trace.marks,
            origin_utc_ns=trace.session_start_utc_ns,
            op_devices=trace.ops.devices,
            aliases=device_aliases([trace]),
        )

    return (
        phases,
        power_of("grpo_synthetic.power.parquet"),
        power_of("grpo_synthetic_rm.power.parquet"),
    )


def test_balance_parts_are_measured_independently_and_agree(sample):
    phases, power, _ = sample
    driver = phases.filter(pl.col("attribution") == "window")
    summary, warnings = balance.energy_balance(power, driver)
    assert warnings == []
    # counters in whole mJ: (68111 + 64175) mJ over the sampled span
    assert summary["total_energy_j"] == pytest.approx(132.286, abs=1e-9)
    assert summary["attributed_energy_j"] == pytest.approx(130.4954086, abs=1e-9)
    assert summary["unattributed_energy_j"] == pytest.approx(1.7905914, abs=1e-9)
    assert summary["energy_conserved"] is True
    assert abs(summary["energy_balance_j"]) < 1e-9
    truth = _truth(SAMPLE)
    # the counter's mJ rounding and the interpolation at phase ends: well under 1 mJ per sample
    assert summary["total_energy_j"] == pytest.approx(truth["total_energy_j"], abs=0.002)
    assert summary["attributed_energy_j"] == pytest.approx(truth["attributed_energy_j"], abs=0.002)
    assert summary["unattributed_energy_j"] == pytest.approx(
        truth["unattributed_energy_j"], abs=1e-9
    )
    # attributed = the phase table's energy outside children: gap_energy_j, else energy_j
    table = energy.phase_energy(phases, NO_DEVICES, pl.DataFrame(), power, idle_power_w=90.0)
    assert table.warnings == []
    window = table.per_range.join(driver.select("rid", "step", "path"), on="rid")
    own = window.select(pl.coalesce("gap_energy_j", "energy_j").sum()).item()
    assert own == pytest.approx(summary["attributed_energy_j"], abs=1e-9)
    steps = window.filter(pl.col("path") == "step").sort("step")
    # between the step's phases both GPUs draw idle power: 2 × 90 W × 1.55 ms
    assert steps["gap_energy_j"].to_list() == pytest.approx([0.279] * 3, abs=1e-9)
    assert steps["energy_j"].to_list() == pytest.approx(
        [42.3369547, 44.79363926, 43.36481464], abs=1e-9
    )


def power_100w(*devices: str) -> PowerData:
    """100 W on each device, sampled every second for 4 s, counter in mJ."""
    t = [k * 1_000_000_000 for k in range(5)]
    return PowerData(
        samples=pl.DataFrame(
            {
                "device": [d for d in devices for _ in t],
                "t_ns": t * len(devices),
                "power_w": [100.0] * (5 * len(devices)),
                "energy_mj": [k * 100_000 for k in range(5)] * len(devices),
            }
        ),
        source="nvml-counter",
        interval_ns=1_000_000_000,
    )


def ranges(*rows: tuple) -> pl.DataFrame:
    """(rid, parent_rid, start_s, end_s) rows."""
    return pl.DataFrame(
        [(r, p, int(a * 1e9), int(b * 1e9)) for r, p, a, b in rows],
        schema={"rid": pl.Int64, "parent_rid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )


def test_overlapping_phases_break_the_balance_with_a_warning():
    power = power_100w("g:0")
    nested = ranges((1, None, 0.5, 3.5), (2, 1, 1, 2))
    summary, warnings = balance.energy_balance(power, nested)
    assert summary == {
        "total_energy_j": 400.0,
        "attributed_energy_j": 300.0,
        "unattributed_energy_j": 100.0,
        "energy_conserved": True,
        "energy_balance_j": 0.0,
    }
    assert warnings == []
    # a range of another thread overlapping both: its second is counted twice
    overlapping = pl.concat([nested, ranges((3, None, 1.5, 2.5))])
    summary, warnings = balance.energy_balance(power, overlapping)
    assert (summary["attributed_energy_j"], summary["unattributed_energy_j"]) == (400.0, 100.0)
    assert (summary["energy_conserved"], summary["energy_balance_j"]) == (False, 100.0)
    assert warnings == [
        "energy not conserved: 400.000 J in phases + 100.000 J outside them = 500.000 J, but the "
        "counters measured 400.000 J (+100.000 J): phase ranges overlap without nesting (driver "
        "ranges of several threads or files, e.g. files of different runs), so their shared time "
        "is counted twice"
    ]


def test_exclusive_intervals_clip_children_to_their_parent():
    frame = ranges(
        (1, None, 0, 100),
        (2, 1, 10, 20),
        (3, 1, 30, 120),  # overhangs its parent
        (4, 3, 40, 50),
        (5, None, 60, 60),  # empty
        (6, None, 200, 300),
        (7, 6, 200, 300),  # covers its parent
    )
    got = balance.exclusive_intervals(frame).with_columns(
        (pl.col("start_ns") // 1_000_000_000), (pl.col("end_ns") // 1_000_000_000)
    )
    assert got.rows() == [
        (1, 0, 10),
        (1, 20, 30),
        (2, 10, 20),
        (3, 30, 40),
        (3, 50, 120),
        (4, 40, 50),
        (7, 200, 300),
    ]


# --- never negative: broken samples and negative intervals are errors, left null ----------------


def test_sample_faults_find_interleaved_series_and_counter_resets():
    def cum(t, j, w=None):
        return pl.DataFrame(
            {"device": "g:0", "t_ns": t, "power_w": w or [100.0] * len(t), "cum_j": j}
        )

    assert samples.sample_faults(cum([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0])) == {}
    # a sampler writing one row twice is not two series
    assert samples.sample_faults(cum([0, 1, 1, 2], [0.0, 1.0, 1.0, 2.0])) == {}
    assert samples.sample_faults(cum([0, 1, 2, 3, 4], [0.0, 5.0, 10.0, 2.0, 7.0])) == {
        "g:0": "its cumulative energy falls 1 time(s)"
    }
    two = cum([0, 0, 1, 1, 2, 2], [0.0, 0.0, 1.0, 3.0, 2.0, 6.0])
    assert samples.sample_faults(two) == {
        "g:0": "2 instants with conflicting readings; its cumulative energy falls 1 time(s)"
    }


def test_two_runs_samples_interleaved_are_errors_and_null(sample):
    """What combining the two sample runs fed the energy code (same sampler host, pid, GPU)."""
    phases, power, power_rm = sample
    mixed = PowerData(
        samples=pl.concat([power.samples, power_rm.samples]).sort("device", "t_ns"),
        source="nvml-counter",
        interval_ns=power.interval_ns,
    )
    table = energy.phase_energy(phases, NO_DEVICES, pl.DataFrame(), mixed, idle_power_w=90.0)
    window = table.per_range.join(phases.filter(pl.col("attribution") == "window"), on="rid")
    assert window.height == 24
    for column in ("energy_j", "avg_power_w", "gap_energy_j", "energy_above_idle_j"):
        assert window[column].null_count() == 24, column
    assert table.per_device["energy_j"].null_count() == table.per_device.height
    assert len(table.warnings) == 2
    for device, warning in zip(
        ("grpo_synthetic:0", "grpo_synthetic:1"), table.warnings, strict=True
    ):
        assert warning.startswith(
            f"ERROR: GPU {device}: power samples are not one series (1680 instants with "
            "conflicting readings; its cumulative energy falls 1680 time(s): two samplers' or "
            "two runs' samples interleaved, or a counter reset); its energy is left null; "
        )
        # the raw energies that came out negative are named, phase by phase
        assert " phase range(s) came out negative: grpo_synthetic pid 1000 step " in warning
    assert balance.energy_balance(mixed, phases.filter(pl.col("pid") == DRIVER_PID)) == (
        dict.fromkeys(
            (
                "total_energy_j",
                "attributed_energy_j",
                "unattributed_energy_j",
                "energy_conserved",
                "energy_balance_j",
            )
        ),
        [],
    )


def test_a_negative_interval_energy_is_an_error_not_a_number():
    phases = pl.DataFrame(
        {
            "rid": [1, 2],
            "parent_rid": [None, None],
            "trace": "t",
            "pid": 7,
            "step": 0,
            "path": ["step/gen", "step/adv"],
            "attribution": "window",
            "start_ns": [1_000_000_000, 3_000_000_000],
            "end_ns": [2_000_000_000, 2_500_000_000],  # adv ends before it starts
        },
        schema_overrides={"parent_rid": pl.Int64},
    )
    table = energy.phase_energy(
        phases, NO_DEVICES, pl.DataFrame(), power_100w("g:0"), idle_power_w=90.0
    )
    assert table.per_range.sort("rid")["energy_j"].to_list() == [100.0, None]
    assert table.warnings == [
        "ERROR: GPU g:0: negative energy, left null; 1 phase range(s) came out negative: "
        "t pid 7 step 0 step/adv (-50.000 J)"
    ]


def test_two_samplers_of_one_identity_in_two_files_stay_apart():
    """The root cause: the two runs' samplers share host, pid and NVML index (power.py)."""
    trace = load_trace(SAMPLE, "grpo_synthetic")
    power = align(
        load_samples(
            [SAMPLES / "grpo_synthetic.power.parquet", SAMPLES / "grpo_synthetic_rm.power.parquet"]
        ),
        trace.marks,
        origin_utc_ns=trace.session_start_utc_ns,
        op_devices=trace.ops.devices,
        aliases=device_aliases([trace]),
    )
    # one sampler's series per GPU: the one with the most samples (1983 vs 1980)
    counts = power.samples.group_by("device").len().sort("device")
    assert counts.rows() == [("grpo_synthetic:0", 1983), ("grpo_synthetic:1", 1983)]
    assert samples.sample_faults(cumulative_energy(power)) == {}


# --- through analyze (needs energy_balance and PhaseEnergy.warnings wired in) -------------------


def test_analyze_reports_the_independent_balance():
    result = analyze([SAMPLE])
    s = result.summary.to_dict()
    assert s["total_energy_j"] == pytest.approx(132.286, abs=1e-9)
    assert s["attributed_energy_j"] == pytest.approx(130.4954086, abs=1e-9)
    assert s["unattributed_energy_j"] == pytest.approx(1.7905914, abs=1e-9)
    assert s["energy_conserved"] is True
    assert abs(s["energy_balance_j"]) < 1e-9
    assert not any(w.startswith("ERROR") or "not conserved" in w for w in result.warnings)


def test_two_runs_forced_together_never_give_negative_energy():
    result = analyze([SAMPLE, SAMPLE_RM], force_combine=True)
    for frame in (result.phases, result.phase_devices):
        for column in ("energy_j", "avg_power_w", "gap_energy_j", "peak_power_w"):
            if column in frame.columns:
                assert frame.filter(pl.col(column) < 0).height == 0, column
    s = result.summary.to_dict()
    # one sampler's counters (grpo_synthetic's, the most samples) for both runs' phases
    assert s["total_energy_j"] == pytest.approx(132.286, abs=1e-9)
    # both runs' drivers overlap on one clock: each is inferred its own GPU pool (its file's
    # GPUs), and the sampled GPUs (host:index, which names both files' GPU 0) are in neither,
    # so no phase is given their energy (null, not counted twice) and all of it is outside
    assert any("GPU pools inferred" in w for w in result.warnings)
    assert result.pools is not None and len(result.pools) == 2
    assert result.phases["energy_j"].null_count() == result.phases.height
    assert s["attributed_energy_j"] == 0
    assert s["unattributed_energy_j"] == pytest.approx(132.286, abs=1e-9)
    assert s["energy_conserved"] is True
    assert not any(w.startswith("ERROR") for w in result.warnings)
    assert any(w.startswith("combined anyway (--force-combine)") for w in result.warnings)
