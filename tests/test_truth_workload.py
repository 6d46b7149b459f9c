"""Workload inputs checked against each other, on real inputs first, each value counted apart.

- the length cap: inferred when >= 1% of the responses (and 2) share the longest length
  (PolyTrace's real rllm/verl-video/dapo records), said as inferred, an explicit --cap wins;
- length records against the run's steps: the steps on either side only are warned by name;
- degenerate lognormal fits (real records: sigma 1e-5, loc -1e8) refused with the reason;
- fidelity against another run's VeRL log: said to look like a different run.
"""

import json
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.workload.lengths import (
    CAP_MIN_SHARE,
    length_stats,
    read_packed_lengths,
    resolve_cap,
)
from nvtx_phases.analysis.workload.stragglers import run_lengths
from nvtxp_testkit import SAMPLES, SHARED, shared_path
from typer.testing import CliRunner

RUN = SAMPLES / "grpo_synthetic.sqlite"  # steps 1, 2, 3
RUN_LENGTHS = SAMPLES / "grpo_synthetic_lengths"  # steps 1, 2, 3
VERL_LOGS = Path(__file__).parent / "data" / "verl_logs"


def _polytrace(name: str) -> Path:
    """A folder of ../shared/polytrace (skip where absent, fail where CI requires it)."""
    return shared_path(f"polytrace/{name}")


def _rllm() -> Path:
    """PolyTrace's rllm records: not in ../shared (a copy fetched for reading is not committed),
    so these cases run only where NVTX_PHASES_SHARED points at a folder holding them."""
    path = SHARED / "polytrace" / "rllm"
    if not path.is_dir():
        pytest.skip(f"{path} not present (PolyTrace's rllm records are not in ../shared)")
    return path


def _outputs_by_step(folder: Path) -> dict[int, list[int]]:
    """Plain Python over the JSON lines: every training response length, by step."""
    steps: dict[int, list[int]] = {}
    for file in sorted(folder.glob("packed_lengths_step_*.jsonl")):
        for line in file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if not row.get("validate"):
                    steps.setdefault(row["step"], []).extend(x for x in row["output"] if x)
    return steps


def _at_longest(steps: dict[int, list[int]]) -> tuple[int, int, int]:
    """(longest, how many responses have it, how many responses) over every step."""
    every = [x for values in steps.values() for x in values]
    return max(every), every.count(max(every)), len(every)


# --- the cap ----------------------------------------------------------------------------------


def test_rllm_cap_is_inferred_from_the_pile_up_at_16000():
    folder = _rllm()
    steps = _outputs_by_step(folder)
    longest, n_at, n = _at_longest(steps)
    assert (longest, n_at, n) == (16000, 96, 640)  # 15%: VeRL's response_length cap
    choice = resolve_cap(read_packed_lengths([folder]))
    assert (choice.value, choice.source, choice.n_at_longest) == (16000, "inferred", n_at)
    assert choice.text() == f"cap 16000 (inferred: {n_at / n:.1%} of responses at the maximum)"
    stats = length_stats(read_packed_lengths([folder]))
    expected = {s: sum(x >= 16000 for x in v) / len(v) for s, v in steps.items()}
    assert dict(stats.select("step", "frac_at_cap").rows()) == expected  # 13–27% per step
    assert set(stats["cap"]) == {16000}
    assert set(stats["cap_source"]) == {"inferred: 15.0% of responses at the maximum"}


def test_no_cap_is_inferred_where_the_longest_response_is_rare():
    # verl-video's rollout stopped at 16,000 too, but only 3 of 10,752 responses reached it
    for name in ("verl-video", "dapo/20260610_092349"):
        folder = _polytrace(name)
        longest, n_at, n = _at_longest(_outputs_by_step(folder))
        assert n_at < CAP_MIN_SHARE * n
        choice = resolve_cap(read_packed_lengths([folder]))
        assert choice.value is None and choice.source is None
        assert (choice.longest, choice.n_at_longest, choice.n_responses) == (longest, n_at, n)
        stats = length_stats(read_packed_lengths([folder]))
        assert stats["frac_at_cap"].null_count() == stats.height  # blank, not 0%
        assert f"is {n_at:,} of {n:,} ({n_at / n:.2%}), under the 1%" in choice.text()


def test_real_lengths_capped_by_hand_are_inferred_and_an_explicit_cap_wins(tmp_path):
    # verl-video's real lengths, clipped at 250 tokens as a rollout with max length 250 would
    source = _polytrace("verl-video")
    for file in source.glob("packed_lengths_step_*.jsonl"):
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        for row in rows:
            row["output"] = [min(x, 250) for x in row["output"]]
        (tmp_path / file.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = _outputs_by_step(tmp_path)
    longest, n_at, n = _at_longest(steps)
    assert longest == 250 and n_at >= CAP_MIN_SHARE * n  # 5.4%
    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["lengths", "analyze", str(tmp_path), "--out", str(out), "--no-fit"]
    )
    assert result.exit_code == 0, result.output
    assert f"cap 250 (inferred: {n_at / n:.1%} of responses at the maximum)" in result.output
    table = pl.read_csv(out / "length_stats.csv")
    expected = {s: sum(x >= 250 for x in v) / len(v) for s, v in steps.items()}
    assert dict(table.select("step", "frac_at_cap").rows()) == pytest.approx(expected)
    # --cap wins (the same statistics, through the API: no second run of the figures)
    table = length_stats(read_packed_lengths([tmp_path]), cap=200)
    expected = {s: sum(x >= 200 for x in v) / len(v) for s, v in steps.items()}
    assert dict(table.select("step", "frac_at_cap").rows()) == pytest.approx(expected)
    assert set(table["cap_source"]) == {"given"}


# --- length records against the run's steps ---------------------------------------------------


@pytest.fixture(scope="module")
def sample_run():
    """The bundled 3-step run, analyzed once for the API-level checks."""
    from nvtx_phases.analysis.run.pipeline import analyze

    with analyze([RUN]) as result:
        yield result


def _run_steps(run: Path) -> list[int]:
    """The run's steps from its generator's ground truth (not from the analysis)."""
    truth = json.loads(run.with_name(run.stem + ".ground_truth.json").read_text())
    return sorted({p["step"] for p in truth["driver_phases"] if p["path"] == "step"})


def test_steps_on_one_side_only_are_named(tmp_path, sample_run):
    assert _run_steps(RUN) == [1, 2, 3]
    # the bundled records (steps 1–3) with an extra step 4, and without step 3
    extra, fewer = tmp_path / "extra", tmp_path / "fewer"
    shutil.copytree(RUN_LENGTHS, extra)
    shutil.copytree(RUN_LENGTHS, fewer)
    (fewer / "packed_lengths_step_3.jsonl").unlink()
    step3 = (RUN_LENGTHS / "packed_lengths_step_3.jsonl").read_text()
    (extra / "packed_lengths_step_4.jsonl").write_text(step3.replace('"step": 3', '"step": 4'))
    assert sorted(_outputs_by_step(extra)) == [1, 2, 3, 4]
    runner = CliRunner()
    out = tmp_path / "out"
    args = ["lengths", "analyze", "--run", str(RUN), "--out", str(out), "--no-fit"]
    result = runner.invoke(app, [*args[:2], str(extra), *args[2:]])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert lines == [
        "warning: length records for step(s) 4 have no step in the run (its steps: 1:3): no "
        "straggler p90 tail or energy per token for them"
    ]
    # the energy table keeps step 4's tokens, with no energy for it (not 0)
    energy = pl.read_csv(out / "energy_per_token.csv")
    assert energy.filter(pl.col("step") == 4)["gen_energy_j"].to_list() == [None]
    # the same check, through the API, for records lacking one of the run's steps
    assert run_lengths(sample_run, read_packed_lengths([fewer])).warnings == [
        "the run's step(s) 3 have no length records (records for steps 1:2): no "
        "lengths, p90 tail or energy per token for them"
    ]


def test_rllm_steps_0_to_4_against_the_3_step_run(sample_run):
    folder = _rllm()
    assert sorted(_outputs_by_step(folder)) == [0, 1, 2, 3, 4]
    tables = run_lengths(sample_run, read_packed_lengths([folder]))
    assert tables.warnings == [
        "length records for step(s) 0, 4 have no step in the run (its steps: 1:3): no "
        "straggler p90 tail or energy per token for them"
    ]
    assert tables.cap.value == 16000 and tables.cap.source == "inferred"
    # steps 1–3 keep their tails; 0 and 4 have tokens but no energy (null, not 0)
    assert sorted(tables.tails["step"].unique()) == [1, 2, 3]
    energy = tables.energy.filter(pl.col("step").is_in([0, 4]))
    assert energy["gen_energy_j"].null_count() == 2 and energy["tokens"].null_count() == 0


def test_a_step_selection_is_checked_and_said(sample_run):
    from nvtx_phases.analysis.run.select import select_steps

    responses = read_packed_lengths([RUN_LENGTHS])
    assert run_lengths(sample_run, responses).warnings == []  # steps 1–3 both sides
    tables = run_lengths(select_steps(sample_run, "1:2"), responses)
    assert tables.warnings == [
        "length records for step(s) 3 have no step in the run (its selected steps: 1:2): no "
        "straggler p90 tail or energy per token for them"
    ]


def test_steps_counted_from_0_against_records_from_1_are_pointed_out():
    from nvtx_phases.analysis.workload.lengths import step_coverage

    (extra, lacking) = step_coverage([1, 2, 3], [0, 1, 2])
    assert extra.startswith("length records for step(s) 3 have no step in the run")
    assert "shifted by +1" in extra and "never shifted" in extra
    assert lacking.startswith("the run's step(s) 0 have no length records")


# --- degenerate fits --------------------------------------------------------------------------


def _inputs_outputs(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Input (per response, as the fits count it) and output lengths, in plain Python."""
    inputs, outputs = [], []
    for file in sorted(folder.glob("packed_lengths_step_*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            if line.strip() and not row.get("validate"):
                kept = [x for x in row["output"] if x is not None]
                inputs += [row["input"]] * len(kept)
                outputs += kept
    return np.array(inputs, dtype=float), np.array(outputs, dtype=float)


def test_rllm_degenerate_output_fit_is_refused_and_the_loc_0_fit_written():
    stats = pytest.importorskip("scipy.stats")
    from nvtx_phases.analysis.workload.fits import fit_lognorm, refused_fit_lines

    _, outputs = _inputs_outputs(_rllm())
    shape, loc, scale = stats.lognorm.fit(outputs)
    assert shape < 1e-3 and loc < -1e8  # the collapsed fit the issue saw: σ 1.3e-5, loc −3.9e8
    fit = fit_lognorm(outputs)
    assert fit["refused"][0]["parameters"] == [shape, loc, scale]
    assert fit["refused"][0]["reason"].startswith(f"sigma {shape:.2g} under the 0.001 floor")
    expected = stats.lognorm.fit(outputs, floc=0)
    assert fit["parameters"] == [float(p) for p in expected]
    ks = stats.kstest(outputs, "lognorm", args=expected).statistic
    assert fit["ks_statistic"] == ks and ks <= 0.3
    (line,) = refused_fit_lines({"output_distribution": fit})
    assert line.startswith("output lengths: lognormal fit refused: sigma 1.3e-05 under the")
    assert "Wrote the fit with loc fixed at 0 instead" in line


def test_verl_video_input_fit_is_refused_both_ways_and_written_as_null():
    stats = pytest.importorskip("scipy.stats")
    from nvtx_phases.analysis.workload.fits import fit_lognorm

    inputs, outputs = _inputs_outputs(_polytrace("verl-video"))
    fit = fit_lognorm(inputs)
    assert fit["parameters"] is None and fit["ks_statistic"] is None
    loc0 = stats.lognorm.fit(inputs, floc=0)
    ks0 = stats.kstest(inputs, "lognorm", args=loc0).statistic
    assert ks0 > 0.3
    assert fit["refused"][1]["reason"] == f"KS statistic {ks0:.3f} over 0.3"
    # the output fit of the same records is sound: written as scipy gives it
    good = fit_lognorm(outputs)
    assert "refused" not in good
    assert good["parameters"] == [float(p) for p in stats.lognorm.fit(outputs)]


def test_lengths_fit_names_the_refused_fit(tmp_path):
    pytest.importorskip("scipy.stats")
    pytest.importorskip("sklearn.mixture")
    out = tmp_path / "params.json"
    result = CliRunner().invoke(app, ["lengths", "fit", str(RUN_LENGTHS), "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1
    assert lines[0].startswith("warning: input lengths: lognormal fit refused: sigma ")
    fits = json.loads(out.read_text())["task_task"]
    assert fits["input_distribution"]["loc_fixed"] == 0.0
    assert fits["input_distribution"]["refused"][0]["parameters"][0] < 1e-3
    assert "refused" not in fits["output_distribution"]


# --- fidelity against another run's log -------------------------------------------------------


def _logged(log: Path, stages: set[str]) -> dict[tuple[int, str], float]:
    """VeRL's timing_s/<stage> per step, with a plain regex over the console log."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        step = re.search(r"step:(\d+) - ", line)
        for stage, value in re.findall(r"timing_s/(\w+):([-\d.e]+)", line):
            if step and stage in stages:
                found[(int(step.group(1)), stage)] = float(value)
    return found


def test_fidelity_against_another_runs_log_says_so(tmp_path):
    truth = json.loads(RUN.with_name("grpo_synthetic.ground_truth.json").read_text())
    traced = {
        (p["step"], p["path"].removeprefix("step/")): p["wall_ns"] / 1e9
        for p in truth["driver_phases"]
    }
    log = VERL_LOGS / "console_grpo.log"  # a GRPO run of seconds per stage; the sample's are ms
    logged = _logged(log, {stage for _, stage in traced})
    pairs = [(traced[k], v) for k, v in logged.items() if k in traced and v >= 0.001]
    accuracy = 100 - statistics.mean(abs(t - v) / v * 100 for t, v in pairs)
    ratio = statistics.median(t / v for t, v in pairs)
    assert len(pairs) == 24 and accuracy < 1 and ratio < 0.01
    out = tmp_path / "fid"
    result = CliRunner().invoke(app, ["fidelity", str(RUN), "--log", str(log), "--out", str(out)])
    assert result.exit_code == 0, result.output
    warning = (
        "the log and the trace look like different runs: "
        f"overall accuracy {accuracy:.2f}% (under 50%); the trace's times are {ratio:.3g}× the "
        "log's (median over 24 pairs; one run gives about 1×, the limit is 2× either way)"
    )
    assert result.output.strip().splitlines()[-1] == "warning: " + warning
    assert result.output.count(warning) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall_accuracy_pct"] == pytest.approx(accuracy, abs=1e-9)
    assert summary["same_run"]["median_time_ratio"] == pytest.approx(ratio, rel=1e-12)
    assert summary["same_run"]["different_runs"] is True
    md = (out / "summary.md").read_text()
    assert md.startswith("**Warning:** The log and the trace look like different runs: overall")


def test_fidelity_names_trace_steps_the_log_lacks(tmp_path):
    log = VERL_LOGS / "file_logger_ppo.jsonl"  # steps 1, 2 timed (step 0: validation only)
    timed = sorted(
        {
            json.loads(line)["step"]
            for line in log.read_text().splitlines()
            if any(k.startswith("timing_s/") for k in json.loads(line)["data"])
        }
    )
    assert timed == [1, 2]
    out = tmp_path / "fid"
    result = CliRunner().invoke(app, ["fidelity", str(RUN), "--log", str(log), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (
        "warning: the log and the trace look like different runs: the trace has 3 step(s), the "
        "log times 2: trace step(s) 3 have no timers in the log; overall accuracy"
    ) in result.output
