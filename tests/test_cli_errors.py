"""Every real way of using the CLI gives a result or one line on stderr with a known exit status.

Expected errors: ``error: …``, exit 2. Bugs: ``internal error: …``, exit 1, traceback only with
NVTX_PHASES_DEBUG=1. Some cases run the installed entry point in a subprocess (real stderr,
real imports); the rest go through typer's CliRunner, which keeps stderr apart.
"""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

runner = CliRunner()
H100 = "nsysai_h100_2gpu_1s.sqlite"
H100_NCCL = "nsysai_mfu_2gpu_before.sqlite"
REPORT_HINT = (
    "(a bug in nvtx-phases: please report it with the command line; "
    "NVTX_PHASES_DEBUG=1 prints the traceback)"
)


def cli(*args: str, env: dict | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """Run ``nvtx-phases ARGS`` in a fresh interpreter (``prelude`` runs before the CLI)."""
    code = (
        f"{prelude}\nimport sys\nfrom analysis.cli import main\nsys.argv[0] = 'nvtx-phases'\nmain()"
    )
    # a fixed width: Rich wraps long lines at the terminal's (or $COLUMNS') width
    env = {**os.environ, "COLUMNS": "250", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300
    )


def one_error_line(stderr: str) -> str:
    """The single line on stderr (fails if there are more, or a traceback)."""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def sqlite_count(path: Path, sql: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchone()[0]


# --- compare on real H100 exports (no VeRL phases) -----------------------------------------------


def test_compare_real_exports_without_phases_says_so_in_one_line(tmp_path):
    a, b = shared_trace(H100), shared_trace(H100_NCCL)
    n_ranges = sqlite_count(a, "SELECT count(*) FROM NVTX_EVENTS WHERE end IS NOT NULL")
    assert n_ranges == 16_782
    done = cli("compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        "error: nsysai_h100_2gpu_1s: no phases to compare (none of its 16,782 NVTX ranges is a "
        "phase: pass --all-ranges, or --phase-map FILE.toml naming yours)"
    )
    assert done.stdout == ""
    assert not (tmp_path / "cmp").exists()


def test_compare_real_exports_with_all_ranges_share_no_phase(tmp_path):
    a, b = shared_trace(H100), shared_trace(H100_NCCL)
    result = runner.invoke(
        app, ["compare", str(a), str(b), "--all-ranges", "--out", str(tmp_path / "cmp")]
    )
    assert result.exit_code == 2
    # PyTorch's ranges carry their op_id in the name: no two captures share one
    assert one_error_line(result.stderr) == (
        "error: runs share no phase: nsysai_mfu_2gpu_before has 18,986 phase path(s) (e.g. "
        "'AllToAll4D, seq = 45440, op_id = 990760'), nsysai_h100_2gpu_1s 16,726 (e.g. "
        "'FSDP::post_forward (encoder.block.0.layer.0), op_id = 317400'), none in common; "
        "nothing to compare"
    )


def test_compare_without_steps_compares_the_whole_capture(tmp_path):
    a = shared_trace(H100)
    out = tmp_path / "cmp"
    result = runner.invoke(
        app, ["compare", str(a), str(a), "-l", "a", "-l", "b", "--all-ranges", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    table = pl.read_csv(out / "compare.csv", schema_overrides={"n_steps": pl.Int64})
    assert table["path"].n_unique() == 16_726
    assert table["n_steps"].null_count() == table.height  # no steps: whole capture
    # a top-level range that occurs once: its wall time straight from SQL
    name = "aten::is_nonzero, op_id = 317126"
    wall_ns = sqlite_count(
        a,
        "SELECT sum(e.end - e.start) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        f"WHERE coalesce(e.text, s.value) = '{name}'",
    )
    assert wall_ns == 428_573_559
    wall = table.filter((pl.col("path") == name) & (pl.col("metric") == "wall_ms")).sort("run")
    assert wall["run"].to_list() == ["a", "b"]
    assert wall["median"].to_list() == [wall_ns / 1e6] * 2
    assert wall["p10"].to_list() == wall["p90"].to_list() == [wall_ns / 1e6] * 2
    assert wall["diff"].to_list() == [0.0, 0.0]
    assert pl.read_csv(out / "compare_steps.csv").height == 0
    text = (out / "compare.md").read_text()
    assert "These runs have no step ranges: each phase is compared over the whole capture" in text
    # the console gets the first 200 lines; the file has every phase
    assert f"more lines in {out / 'compare.md'}" in result.stdout
    # one row per table; no power samples: no energy or power table
    assert [line for line in text.splitlines() if line.startswith("### ")] == [
        "### wall time (ms)",
        "### GPU busy (projection: own launches) (%)",
        "### process GPU busy (projection) (%)",
        "### kernel time (ms)",
        "### NCCL kernel time (ms)",
        "### memcpy time (ms)",
        "### memcpy volume (MB)",
    ]
    assert text.count(f"| {name} | projection |") == 7
    # the whole capture: one value per run, no spread; equal runs differ by 0 (0%)
    assert f"| {name} | projection | 428.6 | 428.6 | 0 | 0% |" in text  # never "+0.0" or "-0.000"
    # figures draw the 30 largest phases, not 16,726
    assert (out / "figures" / "compare_wall_ms.png").exists()


def test_compare_refuses_steps_against_a_whole_capture(tmp_path):
    a = shared_trace(H100)
    result = runner.invoke(
        app,
        [
            "compare",
            str(SAMPLES / "grpo_synthetic.sqlite"),
            str(a),
            "--all-ranges",
            "--out",
            str(tmp_path / "cmp"),
        ],
    )
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        "error: cannot compare grpo_synthetic (per step) with nsysai_h100_2gpu_1s (no step "
        "ranges: whole capture only); compare runs of one kind"
    )


def test_compare_a_damaged_analysis_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("phases.parquet", "phase_devices.parquet", "kernels.csv", "steps.csv"):
        (folder / name).write_bytes(b"PAR1 not really")
    (folder / "summary.json").write_text("{}")
    result = runner.invoke(app, ["compare", str(folder), str(folder), "-l", "x", "-l", "y"])
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: {folder}: cannot read this analysis folder (")
    assert line.endswith("); run `nvtx-phases analyze` again")


# --- option values, parameter files, outputs -----------------------------------------------------


@pytest.mark.parametrize("steps", ["a,b", "0", "1,,x", " "])
def test_verl_config_bad_steps(steps):
    result = runner.invoke(app, ["verl-config", "--steps", steps])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert one_error_line(result.stderr) == (
        f"error: --steps takes step numbers >= 1, comma-separated (e.g. 1,2,3), not '{steps}'"
    )


def test_verl_config_good_steps_with_spaces():
    result = runner.invoke(app, ["verl-config", "--steps", "2, 4"])
    assert result.exit_code == 0
    assert "global_profiler.steps=[2,4]" in result.stdout.splitlines()


def test_lengths_sample_missing_parameter_file(tmp_path):
    missing = tmp_path / "params[bold].json"  # brackets: no Rich markup may eat them
    result = runner.invoke(app, ["lengths", "sample", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == f"error: {missing}: No such file or directory"


GOOD_TASK = {
    "gmm_parameters": {
        "weights": [0.5, 0.5],
        "means": [[100.0, 200.0], [300.0, 900.0]],
        "covariances": [[[100.0, 0.0], [0.0, 400.0]], [[100.0, 10.0], [10.0, 900.0]]],
    }
}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "{not json",
            "not a JSON parameter file (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
        ("[1, 2]", "not a parameter file (a JSON object of <task>_task entries)"),
        ('{"version": "1.0"}', "no task with gmm_parameters"),
        (
            json.dumps(
                {"math_task": {"gmm_parameters": {"weights": [1.0], "means": [[1.0, 2.0]]}}}
            ),
            "task 'math': gmm_parameters needs weights, means and covariances",
        ),
        (
            json.dumps(
                {
                    "math_task": {
                        "gmm_parameters": {**GOOD_TASK["gmm_parameters"], "means": [[1.0, 2.0]]}
                    }
                }
            ),
            "task 'math': gmm_parameters need k weights, k means of 2 and k 2×2 covariances; "
            "got shapes (2,), (1, 2), (2, 2, 2)",
        ),
        (
            json.dumps(
                {
                    "math_task": {
                        "gmm_parameters": {
                            **GOOD_TASK["gmm_parameters"],
                            "covariances": [[[1.0, 5.0], [5.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]],
                        }
                    }
                }
            ),
            "task 'math': a gmm covariance is not symmetric positive semi-definite",
        ),
        (
            json.dumps(
                {"math_task": {"gmm_parameters": {**GOOD_TASK["gmm_parameters"], "weights": "ab"}}}
            ),
            "task 'math': gmm_parameters are not arrays of numbers (could not convert string to float: 'ab')",
        ),
    ],
)
def test_lengths_sample_malformed_parameter_file(tmp_path, content, message):
    params = tmp_path / "params.json"
    params.write_text(content)
    result = runner.invoke(app, ["lengths", "sample", str(params), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == f"error: {params}: {message}"
    assert not (tmp_path / "o").exists()


def test_lengths_sample_good_parameter_file(tmp_path):
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"version": "1.0", "math_task": GOOD_TASK}))
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["lengths", "sample", str(params), "--steps", "2", "--prompts", "3", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "packed_lengths_step_1.jsonl",
        "packed_lengths_step_2.jsonl",
    ]
    rows = [json.loads(line) for line in (out / "packed_lengths_step_1.jsonl").open()]
    assert len(rows) == 3 and all(len(r["output"]) == 8 for r in rows)


def test_synth_bad_steps_is_one_usage_line(tmp_path):
    result = runner.invoke(app, ["synth", str(tmp_path / "x.sqlite"), "--steps", "0"])
    assert result.exit_code == 2
    line = one_error_line(result.stderr)
    assert line.startswith("error: Invalid value for '--steps': ")
    assert line.endswith(" (see 'nvtx-phases synth --help')")
    assert not (tmp_path / "x.sqlite").exists()


def test_synth_unwritable_output(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "run.sqlite"  # a folder that is a file: no user can write there
    result = runner.invoke(app, ["synth", str(out), "--steps", "1"])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        f"error: {out}: cannot write the synthetic run here ({blocker}: File exists)"
    )


def test_fidelity_missing_log_fails_before_analyzing(tmp_path):
    log = tmp_path / "verl.log"
    result = runner.invoke(app, ["fidelity", str(tmp_path / "no_run"), "--log", str(log)])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == f"error: {log}: cannot read (No such file or directory)"


def test_unknown_command_or_option_is_one_usage_line():
    result = runner.invoke(app, ["zzz-no-such"])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        "error: No such command 'zzz-no-such'. (see 'nvtx-phases --help')"
    )
    result = runner.invoke(app, ["--bogus"])
    assert result.exit_code == 2
    assert one_error_line(result.stderr) == (
        "error: No such option: --bogus (see 'nvtx-phases --help')"
    )
    # no arguments at all: the help, as before
    result = runner.invoke(app, [])
    assert "Usage: nvtx-phases [OPTIONS] COMMAND [ARGS]..." in result.output


# --- lengths: malformed records, fits without scipy -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "line", "message"),
    [
        (
            "packed_lengths_step_1.jsonl",
            '{"step": 1, "rank": 0, "dp_rank": 0, "input": "long", "output": [3, 4]}',
            "a field has the wrong type for its layout",
        ),
        ("packed_lengths_step_1.jsonl", '{"step": 1, "rank": 0', "not JSON lines"),
        (
            "reward_timings_step_1.jsonl",
            '{"step": 1, "rank": 0, "dp_rank": 0, "reward_time_s": 1.0}',
            "lacks field(s) response_sum, response_mean, response_max of the reward_timings layout",
        ),
    ],
)
def test_lengths_analyze_malformed_records(tmp_path, name, line, message):
    good = '{"step": 1, "rank": 0, "dp_rank": 0, "input": 5, "output": [3, 4]}\n'
    (tmp_path / "packed_lengths_step_1.jsonl").write_text(good)
    (tmp_path / name).write_text(line + "\n")
    result = runner.invoke(
        app, ["lengths", "analyze", str(tmp_path), "--no-fit", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    error = one_error_line(result.stderr)
    assert error.startswith(f"error: {tmp_path / name}: {message}")


BLOCK_FIT_EXTRA = "import sys\nsys.modules.update({'scipy': None, 'sklearn': None})"


def test_lengths_analyze_without_the_fit_extra(tmp_path):
    # a plain `pip install -e .`: scipy and scikit-learn cannot be imported
    lengths = SAMPLES / "grpo_synthetic_lengths"
    out = tmp_path / "o"
    done = cli("lengths", "analyze", str(lengths), "--out", str(out), prelude=BLOCK_FIT_EXTRA)
    assert done.returncode == 0, done.stderr
    assert one_error_line(done.stderr) == (
        "note: length fits skipped: they need scipy and scikit-learn "
        "(pip install 'nvtx-phases[fit]'); --no-fit skips them quietly"
    )
    # the tables, and length_cdf and length_heatmap as PNG, SVG and the CSV of what they draw
    assert done.stdout.splitlines()[-1] == f"wrote 9 files to {out}/"
    assert sorted(p.name for p in out.glob("*.csv")) == [
        "length_drift.csv",
        "length_stats.csv",
        "rank_imbalance.csv",
    ]
    assert pl.read_csv(out / "length_stats.csv")["n_responses"].to_list() == [64, 64, 64]
    assert not (out / "fits.json").exists()
    # asked for explicitly: refused before any work
    done = cli(
        "lengths", "analyze", str(lengths), "--fit", "--out", str(tmp_path / "p"),
        prelude=BLOCK_FIT_EXTRA,
    )  # fmt: skip
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        "error: length fits need scipy and scikit-learn: pip install 'nvtx-phases[fit]'"
    )
    assert not (tmp_path / "p").exists()


def test_lengths_analyze_fits_by_default_when_the_extra_is_there(tmp_path):
    pytest.importorskip("scipy")
    pytest.importorskip("sklearn")
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["lengths", "analyze", str(SAMPLES / "grpo_synthetic_lengths"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    fits = json.loads((out / "fits.json").read_text())
    assert fits["task_task"]["description"] == "response lengths of 192 responses over 3 step(s)"


# --- markup, bugs -------------------------------------------------------------------------------


def test_help_shows_brackets_literally():
    top = runner.invoke(app, ["--help"], terminal_width=200)
    assert top.exit_code == 0
    assert "nvtx-phases[fit]    length fits (scipy, scikit-learn)" in top.stdout
    assert "pip install 'nvtx-phases[EXTRA]'" in top.stdout
    lengths = runner.invoke(app, ["lengths", "analyze", "--help"], terminal_width=200)
    assert lengths.exit_code == 0
    assert "(needs nvtx-phases[fit]: scipy, scikit-learn)" in lengths.stdout
    profile = runner.invoke(app, ["profile", "--help"], terminal_width=200)
    assert "(nvtx-phases[power])" in profile.stdout


def test_error_with_brackets_is_printed_verbatim(tmp_path):
    path = tmp_path / "[bold]run[/bold] [fit].sqlite"
    done = cli("lengths", "sample", str(path))
    assert done.returncode == 2
    assert one_error_line(done.stderr) == f"error: {path}: No such file or directory"


def test_a_bug_is_one_line_asking_for_a_report(tmp_path, monkeypatch):
    import nvtx_phases.analysis.synth.build as build

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom\n  on two lines")

    monkeypatch.setattr(build, "generate", broken)
    result = runner.invoke(app, ["synth", str(tmp_path / "x.sqlite")])
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == (
        f"internal error: ZeroDivisionError: boom on two lines {REPORT_HINT}"
    )
    debug = runner.invoke(
        app, ["synth", str(tmp_path / "x.sqlite")], env={"NVTX_PHASES_DEBUG": "1"}
    )
    assert debug.exit_code == 1
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert 'raise ZeroDivisionError("boom\\n  on two lines")' in debug.stderr
    assert debug.stderr.splitlines()[-1] == (
        f"internal error: ZeroDivisionError: boom on two lines {REPORT_HINT}"
    )


def test_debug_shows_the_traceback_of_an_expected_error_too(tmp_path):
    log = tmp_path / "verl.log"
    result = runner.invoke(
        app, ["fidelity", str(tmp_path), "--log", str(log)], env={"NVTX_PHASES_DEBUG": "1"}
    )
    assert result.exit_code == 2
    assert "Traceback (most recent call last):" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"error: {log}: cannot read (No such file or directory)"
    )
