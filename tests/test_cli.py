import json

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

runner = CliRunner()

PHASE_COLUMNS = [
    "trace",
    "pid",
    "step",
    "phase",
    "path",
    "attribution",
    "start_ns",
    "end_ns",
    "wall_ns",
    "gpu_busy_ns",
    "idle_ns",
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "n_kernels",
]


def test_analyze_writes_every_output(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["analyze", str(SAMPLES / "grpo_synthetic.sqlite"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "Phases per step (3 steps, 2 GPU(s))" in result.output
    phases = pl.read_parquet(out / "phases.parquet")
    assert set(PHASE_COLUMNS) <= set(phases.columns)
    assert pl.read_csv(out / "phases.csv").height == phases.height == 54
    activity = pl.read_parquet(out / "gpu_activity.parquet")
    assert {
        "device",
        "stream",
        "op_class",
        "name",
        "start_ns",
        "end_ns",
        "bytes",
        "projection_path",
        "projection_step",
        "window_path",
        "window_step",
    } <= set(activity.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_gpu_ns"] == 257_892_636
    assert summary["attributed_gpu_ns"] + summary["unattributed_gpu_ns"] == summary["total_gpu_ns"]
    assert {"n_ranges", "n_gpu_ops", "n_steps", "missing_tables"} <= set(summary)
    kernels = pl.read_csv(out / "kernels.csv")
    assert kernels["count"].sum() == summary["n_kernels"]
    assert (out / "figures" / "phase_time_per_step.png").stat().st_size > 10_000
    # re-running into the same folder replaces the outputs whole
    again = runner.invoke(
        app, ["analyze", str(SAMPLES / "grpo_synthetic.sqlite"), "--out", str(out), "-q"]
    )
    assert again.exit_code == 0
    assert pl.read_parquet(out / "phases.parquet").equals(phases)
    assert not list(out.glob(".*.tmp"))


def test_analyze_a_folder_of_per_process_exports(tmp_path):
    result = runner.invoke(
        app,
        [
            "analyze",
            str(SAMPLES / "grpo_synthetic_split"),
            "--out",
            str(tmp_path),
            "-q",
            "--no-figures",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [t["label"] for t in summary["traces"]] == ["driver", "worker_rank0", "worker_rank1"]
    assert summary["total_gpu_ns"] == 257_892_636


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not an Nsight Systems export"),
        (b'{"traceEvents": []}', "file is not a database"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, message):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(content)
    result = runner.invoke(app, ["analyze", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_file_and_bad_phase_map(tmp_path):
    result = runner.invoke(app, ["analyze", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2 and "no such file" in result.output
    bad_map = tmp_path / "map.toml"
    bad_map.write_text("phases = 3\n")
    result = runner.invoke(
        app, ["analyze", str(SAMPLES / "grpo_synthetic.sqlite"), "--phase-map", str(bad_map)]
    )
    assert result.exit_code == 2 and "'phases' must be a list of strings" in result.output


def test_every_command_has_help():
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Usage" in result.output


def test_help_imports_neither_polars_nor_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys\nfrom analysis.cli import main\nsys.argv = ['nvtx-phases', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'matplotlib'))\n"
        "print('HEAVY', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY []"


def test_jobs_read_a_run_from_its_folder_or_its_traces(tmp_path):
    from nvtx_phases.analysis.jobs import Reporter, analysis_folder, analyze_to, open_run

    trace = SAMPLES / "grpo_synthetic.sqlite"
    stages: list[str] = []
    with analyze_to([trace], tmp_path, figures=False, power_files=[]) as done:
        assert {p.name for p in done.written} >= {"phases.parquet", "summary.json"}
        phases = done.analysis.phases
    assert analysis_folder([tmp_path]) == tmp_path
    assert analysis_folder([trace]) is None
    assert analysis_folder([tmp_path, tmp_path]) is None  # two inputs: traces, never a folder
    reporter = Reporter(stage=stages.append)
    with open_run([tmp_path], reporter=reporter) as saved:  # read back: nothing to analyze
        assert saved.phases.equals(phases)
    assert stages == []
    with open_run([trace], label="again", reporter=reporter) as again:
        assert again.summary.gpu.total_gpu_ns == 257_892_636
    assert stages == ["analyzing again…"]
