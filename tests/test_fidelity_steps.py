"""Fidelity's step pairing: VeRL numbers steps from 1, payload-less step ranges from 0."""

import sqlite3

import pytest
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtx_phases.analysis.workload.fidelity import (
    align_steps,
    compare_with_log,
    read_verl_log,
    to_markdown,
)

OFFSETS = {"gen": 0.10, "old_log_prob": -0.05, "update_actor": 0.02, "step": 0.0}


def test_align_steps_by_number_and_by_order():
    # the trace's steps carry VeRL's numbers (nvtx_phases.verl's payload): paired by number
    assert align_steps([1, 2], [1, 2]) == {
        "mode": "number",
        "pairs": [[1, 2 - 1], [2, 2]],
        "note": "steps paired by number",
    }
    assert align_steps([1, 2, 3], [2, 3, 4])["pairs"] == [[2, 2], [3, 3]]
    # a log that numbers from 0 too: by number
    assert align_steps([0, 1, 2], [0, 1, 2])["mode"] == "number"
    # payload-less steps (0, 1, …) against VeRL's 1, 2, …: by order, the shorter side wins
    order = align_steps([1, 0, 1, 2], [3, 1, 2])
    assert order["mode"] == "order"
    assert order["pairs"] == [[0, 1], [1, 2], [2, 3]]
    assert order["note"] == (
        "steps paired by order: the trace's step ranges carry no step number (numbered 0…2 by "
        "analyze), VeRL's log numbers its steps from 1; 3 pair(s), trace 0 ↔ VeRL 1, "
        "trace 1 ↔ VeRL 2, trace 2 ↔ VeRL 3"
    )
    assert align_steps([0, 1, 2], [6, 7])["pairs"] == [[0, 6], [1, 7]]
    # steps that are not 0…n-1 are never reordered: no pair rather than a wrong one
    assert align_steps([0, 2], [1, 3]) == {
        "mode": "number",
        "pairs": [],
        "note": "steps paired by number",
    }


def _verl_log(path, trace_s, steps):
    """A console log whose step k's timers are the trace's step ``steps[k]`` times (1 + offset)."""
    lines = []
    for logged, traced in steps:
        metrics = {
            f"timing_s/{s}": trace_s[(traced, "step" if s == "step" else f"step/{s}")] * (1 + k)
            for s, k in OFFSETS.items()
        }
        pairs = " - ".join(f"{key}:{value!r}" for key, value in metrics.items())
        lines.append(f"(TaskRunner pid=7) step:{logged} - {pairs}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _window_times(result):
    window = result.phases.filter(result.phases["attribution"] == "window")
    return {(r["step"], r["path"]): r["wall_ns"] / 1e9 for r in window.iter_rows(named=True)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same synthetic run twice: step payloads 1, 2, 3, and with every payload removed."""
    folder = tmp_path_factory.mktemp("fidelity")
    config = SynthConfig(steps=3, ranks=1, kernels_per_phase=4, power=False, lengths=False)
    numbered = generate(folder / "numbered.sqlite", config)[0]
    bare = generate(folder / "bare.sqlite", config)[0]
    with sqlite3.connect(bare) as con:
        con.execute("UPDATE NVTX_EVENTS SET int64Value = NULL, uint64Value = NULL")
    return analyze([numbered]), analyze([bare]), folder


def test_payload_less_steps_pair_by_order_with_exact_errors(runs):
    numbered, bare, folder = runs
    assert sorted(numbered.steps["step"].to_list()) == [1, 2, 3]
    assert sorted(bare.steps["step"].to_list()) == [0, 1, 2]
    times = _window_times(numbered)
    log = _verl_log(folder / "verl.log", times, [(1, 1), (2, 2), (3, 3)])
    expected = {stage: (1 / (1 + k) - 1) * 100 for stage, k in OFFSETS.items()}
    overall = 100 - sum(abs(e) for e in expected.values()) / len(expected)
    for result, mode in ((numbered, "number"), (bare, "order")):
        per_step, summary = compare_with_log(result, read_verl_log(log))
        assert summary["step_alignment"]["mode"] == mode
        assert summary["matched_steps"] == [1, 2, 3]
        assert per_step.height == 12
        for stage, error in expected.items():
            assert summary["stages"][stage]["mean_error_pct"] == pytest.approx(error, abs=1e-9)
        assert summary["overall_accuracy_pct"] == pytest.approx(overall, abs=1e-9)
    per_step, summary = compare_with_log(bare, read_verl_log(log))
    assert per_step.select("step", "trace_step").unique().sort("step").rows() == [
        (1, 0),
        (2, 1),
        (3, 2),
    ]
    assert "Note: steps paired by order" in to_markdown(summary)
    assert "Note:" not in to_markdown(compare_with_log(numbered, read_verl_log(log))[1])


def test_off_by_one_pairing_is_what_order_alignment_fixes(runs):
    # pairing the payload-less trace by number (its step 1 with VeRL's step 1) compares each
    # step with the next one's timers: what fidelity scored before steps were aligned
    numbered, bare, folder = runs
    times = _window_times(numbered)
    shifted = _verl_log(folder / "shifted.log", times, [(1, 2), (2, 3)])
    _, by_number = compare_with_log(numbered, read_verl_log(shifted))
    assert by_number["step_alignment"]["mode"] == "number"
    assert by_number["overall_accuracy_pct"] < 99.0
    _, by_order = compare_with_log(bare, read_verl_log(shifted))
    assert by_order["step_alignment"]["pairs"] == [[0, 1], [1, 2]]
    assert by_order["overall_accuracy_pct"] < 99.0  # VeRL's 1, 2 hold trace steps 2, 3


def test_stages_logged_under_a_millisecond_are_listed_but_not_scored(runs, tmp_path):
    # VeRL's reward timer can read 11 µs while its NVTX range reads 37 µs: the relative error
    # measures the timers' overhead, so such pairs stay in the table but not in the overall score
    numbered, _, _ = runs
    times = _window_times(numbered)
    log = _verl_log(tmp_path / "verl.log", times, [(1, 1), (2, 2), (3, 3)])
    lines = [f"{line} - timing_s/reward:0.0005" for line in log.read_text().splitlines()]
    log.write_text("\n".join(lines) + "\n")
    per_step, summary = compare_with_log(numbered, read_verl_log(log))
    expected = {stage: (1 / (1 + k) - 1) * 100 for stage, k in OFFSETS.items()}
    assert per_step.height == 15  # 3 steps × (4 stages + reward)
    reward_error = [(times[(s, "step/reward")] - 0.0005) / 0.0005 * 100 for s in (1, 2, 3)]
    assert summary["stages"]["reward"]["mean_error_pct"] == pytest.approx(
        sum(reward_error) / 3, abs=1e-9
    )
    assert summary["unscored_stages"] == ["reward"]
    assert summary["n_scored_pairs"] == 12
    overall = 100 - sum(abs(e) for e in expected.values()) / len(expected)
    assert summary["overall_accuracy_pct"] == pytest.approx(overall, abs=1e-9)
    assert "Not in the overall accuracy (logged under 1 ms" in to_markdown(summary)
    assert "| reward | 3 |" in to_markdown(summary)
    assert (
        to_markdown(summary).split("| reward | 3 |")[1].splitlines()[0].endswith("| not scored |")
    )
    assert summary["missing_in_trace"] == []


def test_a_stage_logged_but_missing_from_the_trace_is_named(runs, tmp_path):
    # as in a real VeRL run: step 2's update_weights timed by VeRL, its NVTX range never flushed
    numbered, _, _ = runs
    times = _window_times(numbered)
    log = _verl_log(tmp_path / "verl.log", times, [(1, 1), (2, 2), (3, 3)])
    lines = log.read_text().splitlines()
    lines[1] += " - timing_s/update_critic:0.25"  # GRPO: the trace has no critic
    lines.append("(TaskRunner pid=7) step:9 - timing_s/update_critic:0.5")  # no traced step 9
    log.write_text("\n".join(lines) + "\n")
    _, summary = compare_with_log(numbered, read_verl_log(log))
    assert summary["missing_in_trace"] == [[2, "update_critic"]]
    assert summary["n_pairs"] == 12
    assert "Logged by VeRL but not in the trace: step 2 update_critic (" in to_markdown(summary)


def test_a_step_range_cut_at_the_capture_end_is_not_scored(runs, tmp_path):
    # a real VeRL run under nsys 2022.4: the trainer's actor was killed before its last pop was
    # flushed; nsys ended the last step range at the capture's end (5.23 s for VeRL's 1.33 s)
    numbered, _, folder = runs
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes((folder / "numbered.sqlite").read_bytes())
    with sqlite3.connect(cut) as con:
        (duration,) = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()
        (rowid,) = con.execute(
            "SELECT e.rowid FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) = 'step' ORDER BY e.start DESC LIMIT 1"
        ).fetchone()
        con.execute("UPDATE NVTX_EVENTS SET end = ? WHERE rowid = ?", (duration, rowid))
    times = _window_times(numbered)
    log = _verl_log(tmp_path / "verl.log", times, [(1, 1), (2, 2), (3, 3)])
    rows, summary = compare_with_log(analyze([cut]), read_verl_log(log))
    assert summary["cut_pairs"] == [[3, "step"]]
    assert rows.filter("cut_at_capture_end").select("step", "stage").rows() == [(3, "step")]
    assert summary["n_pairs"] == 11 and summary["stages"]["step"]["n_steps"] == 2
    expected = {stage: (1 / (1 + k) - 1) * 100 for stage, k in OFFSETS.items()}
    overall = 100 - sum(3 * abs(e) for s, e in expected.items() if s != "step") / 11
    assert summary["overall_accuracy_pct"] == pytest.approx(overall, abs=1e-9)
    assert "Not scored: step 3 step: a range of it ends exactly at the end" in to_markdown(summary)


def test_same_run_check_quiet_on_one_run_and_names_what_differs(runs, tmp_path):
    from nvtx_phases.analysis.workload.fidelity import mismatch_warning

    numbered, _, _ = runs
    times = _window_times(numbered)
    log = _verl_log(tmp_path / "same.log", times, [(1, 1), (2, 2), (3, 3)])
    _, summary = compare_with_log(numbered, read_verl_log(log))
    ratios = sorted(1 + k for k in OFFSETS.values() for _ in range(3))
    assert summary["same_run"]["different_runs"] is False and mismatch_warning(summary) is None
    # trace ÷ logged = 1 / (1 + offset): the median of the 12 pairs
    median = (1 / ratios[5] + 1 / ratios[6]) / 2
    assert summary["same_run"]["median_time_ratio"] == pytest.approx(median, rel=1e-12)
    assert not to_markdown(summary).startswith("**Warning:**")
    # a log of more steps than the capture holds (a capture of some steps): a note, no warning
    longer = log.read_text() + "(TaskRunner pid=7) step:4 - timing_s/gen:1.0 - timing_s/step:2.0\n"
    (tmp_path / "longer.log").write_text(longer)
    _, summary = compare_with_log(numbered, read_verl_log(tmp_path / "longer.log"))
    assert summary["same_run"]["different_runs"] is False
    assert "Note: the log times 4 steps, the trace holds 3: only the steps in both" in to_markdown(
        summary
    )
    # a log of fewer steps than the trace: named, even with exact times
    shorter = _verl_log(tmp_path / "short.log", times, [(1, 1), (2, 2)])
    _, summary = compare_with_log(numbered, read_verl_log(shorter))
    assert mismatch_warning(summary) == (
        "the log and the trace look like different runs: the trace has 3 step(s), the log "
        "times 2: trace step(s) 3 have no timers in the log"
    )
    # a log whose times are 3× the trace's: accuracy and the time ratio both say so
    tripled = {key: value * 3 for key, value in times.items()}
    far = _verl_log(tmp_path / "far.log", tripled, [(1, 1), (2, 2), (3, 3)])
    _, summary = compare_with_log(numbered, read_verl_log(far))
    errors = [abs(1 / (3 * (1 + k)) - 1) * 100 for k in OFFSETS.values()]
    accuracy = 100 - sum(errors) / len(errors)
    assert summary["overall_accuracy_pct"] == pytest.approx(accuracy, abs=1e-9)
    assert summary["same_run"]["median_time_ratio"] == pytest.approx(median / 3, rel=1e-12)
    assert summary["same_run"]["reasons"] == [
        f"overall accuracy {accuracy:.2f}% (under 50%)",
        f"the trace's times are {median / 3:.3g}× the log's (median over 12 pairs; one run "
        "gives about 1×, the limit is 2× either way)",
    ]
