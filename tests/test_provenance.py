"""``nvtx-phases --version`` and the ``provenance`` object of ``summary.json``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import nvtx_phases.analysis.model
import polars as pl
import pytest
from nvtx_phases.analysis import RunSummary, analyze, load_analysis, write_outputs
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.model import InputFile, Provenance, tool_version
from nvtxp_testkit import REPO, SAMPLES
from typer.testing import CliRunner

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
POWER = SAMPLES / "grpo_synthetic.power.parquet"
CPU = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"


def _utc(stamp: str) -> datetime:
    assert stamp.endswith("Z")
    return datetime.fromisoformat(stamp[:-1] + "+00:00")


def test_version_prints_the_installed_version():
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0, done.output
    assert done.output == f"nvtx-phases {importlib.metadata.version('nvtx-phases')}\n"


def test_version_from_the_console_script_module():
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_phases.analysis.cli", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"nvtx-phases {tool_version()}\n"


def test_version_without_package_metadata_reads_pyproject(monkeypatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    text = (REPO / "pyproject.toml").read_text()
    expected = next(
        line.split('"')[1] for line in text.splitlines() if line.startswith("version = ")
    )
    assert nvtx_phases.analysis.model.tool_version() == expected


def test_api_provenance_has_no_command_line():
    started = datetime.now(timezone.utc)
    with analyze([SAMPLE]) as result:
        prov = result.summary.provenance
    assert prov is not None
    assert prov.command_line is None
    assert prov.tool_version == tool_version()
    assert prov.python_version == platform.python_version()
    assert prov.polars_version == pl.__version__
    assert prov.options == {
        "phase_map": None,
        "all_ranges": False,
        "strip_args": False,
        "power_files": None,  # found beside the trace
        "idle_power_w": None,
        "jobs": 1,
        "engine": "process",
        "chunk_ops": 2_000_000,
        "spill_dir": None,
        "force_combine": False,
        "steps": None,
    }
    assert [(f.kind, f.path) for f in prov.inputs] == [
        ("trace", str(SAMPLE.absolute())),
        ("power", str(POWER.absolute())),
    ]
    for record, path in zip(prov.inputs, (SAMPLE, POWER), strict=True):
        info = os.stat(path)
        assert record.size_bytes == info.st_size
        assert abs(_utc(record.mtime_utc).timestamp() - info.st_mtime) < 1e-3
    at = _utc(prov.analyzed_at_utc)
    assert started - timedelta(seconds=1) <= at <= datetime.now(timezone.utc)


def test_cli_records_command_line_options_and_phase_map(tmp_path):
    phase_map = tmp_path / "map.toml"
    phase_map.write_text('phases = ["extra"]\n')
    out = tmp_path / "out"
    args = [
        "analyze",
        str(CPU),
        "--out",
        str(out),
        "-q",
        "--no-figures",
        "--phase-map",
        str(phase_map),
        "--top-kernels",
        "3",
        "--no-power",
    ]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert prov["command_line"] == ["nvtx-phases", *args]
    assert prov["options"]["phase_map"] == str(phase_map.absolute())
    assert prov["options"]["top_kernels"] == 3
    assert prov["options"]["power_files"] == []
    assert [i["kind"] for i in prov["inputs"]] == ["trace", "phase_map"]
    assert prov["inputs"][1]["size_bytes"] == phase_map.stat().st_size
    # read back typed, and equal to what was written
    summary = load_analysis(out).summary
    assert summary.provenance is not None
    assert summary.provenance.to_dict() == prov


def test_report_from_traces_records_its_command_line(tmp_path):
    args = ["report", str(CPU), "--out", str(tmp_path / "rep")]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    prov = json.loads((tmp_path / "rep" / "summary.json").read_text())["provenance"]
    assert prov["command_line"] == ["nvtx-phases", *args]


def test_provenance_round_trips_and_older_summaries_have_none(tmp_path):
    with analyze([CPU]) as result:
        write_outputs(result, tmp_path)
        summary = result.summary
    data = json.loads((tmp_path / "summary.json").read_text())
    assert list(data)[-1] == "provenance"
    assert RunSummary.from_dict(data) == summary
    assert RunSummary.from_dict(data).to_dict() == data
    assert Provenance.from_dict(data["provenance"]) == summary.provenance
    older = {k: v for k, v in data.items() if k != "provenance"}
    assert RunSummary.from_dict(older).provenance is None
    assert RunSummary.from_dict(older | {"provenance": None}).provenance is None


def test_unreadable_input_is_recorded_without_size():
    from nvtx_phases.analysis.run.provenance import input_file

    record = input_file("trace", "/nonexistent/x.sqlite")
    assert record == InputFile("trace", "/nonexistent/x.sqlite", None, None)


def test_malformed_provenance_is_a_named_error(tmp_path):
    with analyze([CPU]) as result:
        write_outputs(result, tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps(data | {"provenance": {"tool": 1}}))
    from nvtx_phases.analysis.errors import SavedAnalysisError

    with pytest.raises(SavedAnalysisError, match="not a summary"):
        load_analysis(tmp_path)
