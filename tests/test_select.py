"""Step selection (``--steps``): spec parsing, exact restriction of every table, recounted totals."""

from __future__ import annotations

import json
from collections import defaultdict

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import InputError
from nvtx_phases.analysis.jobs import open_run
from nvtx_phases.analysis.render.outputs.files import write_outputs
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.run.select import parse_steps, select_steps, steps_text
from nvtxp_testkit import SAMPLES
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
runner = CliRunner()


@pytest.fixture(scope="module")
def full():
    with analyze([SAMPLE]) as result:
        yield result


# --- the spec -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "items", "picked"),
    [
        ("5", ((5, 5),), [5]),
        ("2:3", ((2, 3),), [2, 3]),
        ("5:50", ((5, 50),), [5, 6, 7, 8, 9, 10]),
        ("8:", ((8, None),), [8, 9, 10]),
        (":2", ((None, 2),), [0, 1, 2]),
        (":", ((None, None),), list(range(11))),
        ("1,3,7", ((1, 1), (3, 3), (7, 7)), [1, 3, 7]),
        (" 1 , 4:5 ,9: ", ((1, 1), (4, 5), (9, None)), [1, 4, 5, 9, 10]),
        ("3:3", ((3, 3),), [3]),
        ("0", ((0, 0),), [0]),
        ("3,1,3", ((3, 3), (1, 1), (3, 3)), [1, 3]),
        ("20:", ((20, None),), []),
    ],
)
def test_spec_parsing(spec, items, picked):
    parsed = parse_steps(spec)
    assert parsed.items == items
    assert parsed.picks(range(11)) == picked


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "'' is not a step"),
        ("1,,2", "'' is not a step"),
        ("a", "'a' is not a step"),
        ("-1", "'-1' is not a step"),
        ("1.5", "'1.5' is not a step"),
        ("1 2", "'1 2' is not a step"),
        ("1:2:3", "'1:2:3' is not a step"),
        ("3:1", "range 3:1 ends before it starts"),
    ],
)
def test_bad_specs_are_one_line_input_errors(spec, says):
    with pytest.raises(InputError, match=says) as caught:
        parse_steps(spec)
    assert "\n" not in str(caught.value)


def test_steps_text_writes_runs_as_ranges():
    assert steps_text([1, 2, 3, 5, 7, 8]) == "1:3, 5, 7:8"
    assert steps_text([4]) == "4"


# --- the selection on the sample run (3 steps) ----------------------------------------------------


def test_selection_keeps_exactly_the_selected_rows(full):
    selected = select_steps(full, "2:3")
    in_23 = pl.col("step").is_in([2, 3])
    assert set(selected.phases["step"]) == {2, 3} and selected.phases.height == 36
    assert_frame_equal(selected.phases, full.phases.filter(in_23))
    assert_frame_equal(selected.phase_devices, full.phase_devices.filter(in_23))
    assert_frame_equal(selected.steps, full.steps.filter(in_23))
    activity = full.gpu_activity.collect()
    assert_frame_equal(
        selected.gpu_activity.collect(), activity.filter(pl.col("window_step").is_in([2, 3]))
    )
    assert selected.summary.n_steps == 2
    assert selected.summary.n_phase_ranges == 36  # one range per row in the sample
    assert selected.power_samples is full.power_samples  # the run's inputs, kept whole
    assert selected.summary.energy == full.summary.energy


def test_selected_totals_equal_sums_over_the_steps_operations(full):
    selected = select_steps(full, "2:3").summary.gpu
    rows = full.gpu_activity.collect().to_dicts()
    mine = [r for r in rows if r["window_step"] in (2, 3)]

    def total(keep) -> int:
        return sum(r["dur_ns"] for r in mine if keep(r))

    assert selected.total_gpu_ns == total(lambda r: True) == 173_918_205
    assert selected.attributed_gpu_ns == total(lambda r: r["window_path"] is not None)
    assert selected.unattributed_gpu_ns == total(lambda r: r["window_path"] is None) == 0
    assert selected.projection_attributed_gpu_ns == total(lambda r: r["projection_path"])
    assert selected.projection_unattributed_gpu_ns == 0
    # the two parts of a selection come from one column of the same rows: they cannot test
    # conservation, so the flag is the whole run's (its sides were computed independently)
    assert selected.gpu_time_conserved is full.summary.gpu.gpu_time_conserved is True
    assert selected.n_gpu_ops == len(mine) == 894
    assert selected.n_kernels == sum(r["kind"] == "kernel" for r in mine)
    assert selected.kernel_ns == total(lambda r: r["kind"] == "kernel")
    assert selected.nccl_ns == total(lambda r: r["op_class"] == "nccl")
    assert selected.memcpy_ns == total(lambda r: r["kind"] == "memcpy")
    assert selected.memcpy_bytes == sum(r["bytes"] or 0 for r in mine if r["kind"] == "memcpy")
    assert selected.memset_ns == total(lambda r: r["kind"] == "memset")
    # the steps add up: 2:3 is step 2 plus step 3
    each = [select_steps(full, str(s)).summary.gpu for s in (2, 3)]
    assert selected.total_gpu_ns == sum(g.total_gpu_ns for g in each)
    assert selected.n_kernels == sum(g.n_kernels for g in each)


def test_selected_kernel_table_is_recounted_from_the_selected_operations(full):
    selected = select_steps(full, "2:")
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in full.gpu_activity.collect().to_dicts():
        if row["window_step"] in (2, 3) and row["kind"] in ("kernel", "graph"):
            expected[row["name"]][0] += 1
            expected[row["name"]][1] += row["dur_ns"]
    got = {r["name"]: [r["count"], r["total_ns"]] for r in selected.kernels.to_dicts()}
    assert got == dict(expected)
    assert selected.kernels.schema == full.kernels.schema
    assert selected.kernels["count"].sum() < full.kernels["count"].sum()


def test_selection_records_what_it_excluded(full):
    selected = select_steps(full, "2:3")
    note = selected.warnings[-1]
    assert note == (
        "--steps '2:3' selected 2 of 3 steps (2:3); excluded 455 GPU operation(s), 83.974 ms, "
        "outside them (8, 0.800 ms, in no step) and 18 phase row(s); GPU totals count whole "
        "operations by the step and phase at their start; energy totals are the whole run's"
    )
    assert selected.warnings[:-1] == full.warnings
    excluded = full.summary.gpu.total_gpu_ns - selected.summary.gpu.total_gpu_ns
    assert excluded == 83_974_431
    assert full.summary.gpu.n_gpu_ops - selected.summary.gpu.n_gpu_ops == 455
    record = selected.summary.to_dict()["selection"]
    assert record["steps"] == [2, 3] and record["available_steps"] == [1, 2, 3]
    assert (record["excluded_gpu_ops"], record["excluded_gpu_ns"]) == (455, 83_974_431)
    assert (record["excluded_no_step_gpu_ops"], record["excluded_phase_rows"]) == (8, 18)
    assert "selection" not in full.summary.to_dict()
    partly = select_steps(full, "1,5")
    assert "selected 1 of 3 steps (1); no step 5;" in partly.warnings[-1]
    assert partly.summary.selection is not None and partly.summary.selection["not_found"] == [5]


def test_every_step_keeps_every_stepped_row_and_drops_only_stepless_operations(full):
    selected = select_steps(full, ":")
    assert_frame_equal(selected.phases, full.phases)  # every phase row of the sample has a step
    assert selected.summary.gpu.total_gpu_ns == full.summary.gpu.total_gpu_ns - 800_000
    assert selected.summary.gpu.unattributed_gpu_ns == 0


def test_a_spec_matching_no_step_names_the_steps_there_are(full):
    with pytest.raises(InputError) as caught:
        select_steps(full, "7:9")
    assert str(caught.value) == ("--steps '7:9' matches no step of this run (steps available: 1:3)")


def test_selection_on_spilled_buckets_equals_the_single_pass(full, tmp_path):
    with analyze([SAMPLE], chunk_ops=300, spill_dir=tmp_path) as bucketed:
        assert bucketed.workdir is not None
        a, b = select_steps(full, "2"), select_steps(bucketed, "2")
        assert_frame_equal(a.phases, b.phases)
        assert_frame_equal(a.gpu_activity.collect(), b.gpu_activity.collect().sort("op_id"))
        assert a.summary.gpu == b.summary.gpu
        assert_frame_equal(a.kernels, b.kernels)


def test_an_analysis_folder_selects_like_the_traces(full, tmp_path):
    write_outputs(full, tmp_path / "run")
    with open_run([tmp_path / "run"], steps="2:3") as saved:
        fresh = select_steps(full, "2:3")
        assert_frame_equal(saved.phases, fresh.phases)
        assert saved.summary.gpu == fresh.summary.gpu
        assert saved.summary.n_steps == 2
    with pytest.raises(InputError, match="steps available: 1:3"):
        open_run([tmp_path / "run"], steps="4")


def test_cli_analyze_report_and_compare_take_steps(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["analyze", str(SAMPLE), "--out", str(out), "--steps", "2:", "--no-figures", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert set(pl.read_csv(out / "phases.csv")["step"]) == {2, 3}
    assert set(pl.read_csv(out / "steps.csv")["step"]) == {2, 3}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_gpu_ns"] == 173_918_205 and summary["n_steps"] == 2
    assert summary["warnings"][-1].startswith("--steps '2:' selected 2 of 3 steps (2:3)")
    report = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "r"), "--steps", "3"])
    assert report.exit_code == 0, report.output
    assert "--steps '3' selected 1 of" in (tmp_path / "r" / "report.md").read_text()
    rm = str(SAMPLES / "grpo_synthetic_rm.sqlite")
    compare = runner.invoke(
        app, ["compare", str(out), rm, "--steps", "2:3", "--out", str(tmp_path / "c")]
    )
    assert compare.exit_code == 0, compare.output
    assert set(pl.read_csv(tmp_path / "c" / "compare_steps.csv")["step"]) == {2, 3}


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("2-3", "error: --steps '2-3': '2-3' is not a step N"),
        ("8", "error: --steps '8' matches no step of this run (steps available: 1:3)"),
    ],
)
def test_cli_bad_steps_fail_in_one_line(tmp_path, spec, line):
    result = runner.invoke(app, ["analyze", str(SAMPLE), "--out", str(tmp_path), "--steps", spec])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(line)
