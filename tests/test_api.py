"""The Python API as a notebook user calls it: ``from analysis import analyze`` and friends."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from nvtx_phases.analysis import (
    WINDOW,
    Analysis,
    NothingToAnalyze,
    RunSummary,
    analyze,
    load_analysis,
    write_outputs,
)
from nvtxp_testkit import SAMPLES, shared_trace

from nvtx_phases import analysis

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"


def test_analyze_returns_typed_frozen_result(tmp_path):
    with analyze([SAMPLE]) as result:
        assert isinstance(result, Analysis)
        assert isinstance(result.summary, RunSummary)
        # the sample's ground truth (tests/test_synthetic.py checks it against the generator)
        assert result.summary.gpu.total_gpu_ns == 257_892_636
        assert result.summary.gpu.n_gpu_ops == 1349
        assert result.summary.n_steps == 3
        assert result.summary.energy is not None
        assert result.summary.energy.power_source == "nvml-counter"
        assert result.gpu_activity.select(pl.len()).collect().item() == 1349
        gen = result.phases.filter(
            (pl.col("path") == "step/gen") & (pl.col("attribution") == WINDOW)
        )
        assert gen.height == 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.phases = pl.DataFrame()  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.summary.n_steps = 4  # type: ignore[misc]
        written = write_outputs(result, tmp_path / "run")
    assert {p.name for p in written} >= {"phases.parquet", "summary.json", "gpu_activity.parquet"}
    loaded = load_analysis(tmp_path / "run")
    # summary.json round-trips into the same typed summary
    assert loaded.summary == result.summary
    assert loaded.phases.equals(result.phases)
    assert loaded.warnings == result.warnings


def test_summary_json_keeps_its_flat_layout(tmp_path):
    with analyze([SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"]) as result:
        write_outputs(result, tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    # no power: one null power_source, none of the energy keys
    assert data["power_source"] is None
    assert "total_energy_j" not in data
    assert list(data)[:3] == ["total_gpu_ns", "attributed_gpu_ns", "unattributed_gpu_ns"]
    assert RunSummary.from_dict(data).to_dict() == data


def test_spilled_result_owns_its_temporary_files(tmp_path):
    result = analyze([SAMPLE], chunk_ops=300, spill_dir=tmp_path)
    assert result.workdir is not None and result.workdir.exists()
    assert result.summary.n_buckets == 5
    with result:
        assert result.gpu_activity.select(pl.len()).collect().item() == 1349
    assert not result.workdir.exists()
    result.close()  # idempotent


def test_damaged_summary_is_a_named_error(tmp_path):
    with analyze([SAMPLE]) as result:
        write_outputs(result, tmp_path)
    (tmp_path / "summary.json").write_text('{"total_gpu_ns": 1}')
    with pytest.raises(analysis.AnalysisError, match=r"summary.json: not a summary"):
        load_analysis(tmp_path)


def test_nothing_to_analyze_is_a_named_error():
    # a real export from someone's repository with neither NVTX nor GPU activity tables
    empty = shared_trace("wild/Donovoi__ripgrep__report1.sqlite")
    with pytest.raises(NothingToAnalyze, match="nothing to analyze"):
        analyze([empty])


def test_public_names_load_lazily():
    assert set(analysis.__all__) >= {"analyze", "load_analysis", "write_outputs", "Analysis"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        analysis.nope  # noqa: B018


def test_analyze_to_writes_what_the_command_writes(tmp_path):
    from nvtx_phases.analysis.jobs import analyze_to

    with analyze_to([SAMPLE], tmp_path / "run") as done:
        assert done.analysis.summary.gpu.n_gpu_ops == 1349
    names = {p.relative_to(tmp_path / "run").as_posix() for p in done.written}
    assert {"phases.parquet", "kernels_by_phase.csv", "power_envelope.csv", "summary.json"} <= names
    assert "figures/power_envelope.png" in names and "figures/phase_time_per_step.png" in names
    assert (tmp_path / "run" / ".nvtx-phases-outputs.json").exists()


# --- the API takes what the CLI takes (issue 27: one options object, same outputs) -----------


def test_api_takes_a_path_a_folder_and_every_option(tmp_path):
    import sqlite3

    from nvtx_phases.analysis.options import AnalyzeOptions

    split = SAMPLES / "grpo_synthetic_split"  # a folder of one run's per-process exports
    with analyze(str(split)) as run:
        # GPU operations of the folder's files, counted with plain SQL
        total = 0
        for export in sorted(split.glob("*.sqlite")):
            with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as db:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
                for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
                    if table in tables:
                        total += db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        assert run.summary.gpu.n_gpu_ops >= total > 0
    options = AnalyzeOptions(steps="2:", all_ranges=True, strip_args=True)
    with analyze(SAMPLE, options) as run:
        assert set(run.phases["step"].drop_nulls()) == {2, 3}
        assert run.summary.provenance is not None
        recorded = run.summary.provenance.options
        assert (recorded["steps"], recorded["all_ranges"], recorded["strip_args"]) == (
            "2:",
            True,
            True,
        )
    # keywords change the options object; both ways give the same phase table
    with analyze([SAMPLE], options, steps="3") as a, analyze([SAMPLE], steps="3") as b:
        assert set(a.phases["step"].drop_nulls()) == {3}
        assert b.phases.filter(pl.col("path") == "step").height >= 1


def test_api_errors_are_the_cli_errors(tmp_path):
    from nvtx_phases.analysis.errors import InputError, PhaseMapError

    with pytest.raises(InputError, match="unknown option"):
        analyze(SAMPLE, job=2)
    with pytest.raises(InputError, match="--steps"):
        analyze(SAMPLE, steps="two")
    with pytest.raises(PhaseMapError, match="phase map file not found"):
        analyze(SAMPLE, phase_map=tmp_path / "missing.toml")
    with pytest.raises(analysis.AnalysisError, match="no such file"):
        analyze(tmp_path / "nothing.sqlite")


def test_phase_map_file_from_the_api_is_recorded(tmp_path):
    phase_map = tmp_path / "map.toml"
    phase_map.write_text('phases = ["extra"]\n')
    with analyze(SAMPLE, phase_map=str(phase_map), power_files=[]) as run:
        prov = run.summary.provenance
    assert prov is not None
    assert prov.options["phase_map"] == str(phase_map.absolute())
    assert [f.kind for f in prov.inputs] == ["trace", "phase_map"]


def _files(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def test_api_and_cli_write_the_same_tables(tmp_path):
    from nvtx_phases.analysis.cli import app
    from typer.testing import CliRunner

    power = SAMPLES / "grpo_synthetic.power.parquet"
    args = ["analyze", str(SAMPLE), "--out", str(tmp_path / "cli"), "-q", "--no-figures"]
    done = CliRunner().invoke(app, [*args, "--power", str(power)])
    assert done.exit_code == 0, done.output
    with analyze([SAMPLE], power_files=[power]) as run:
        write_outputs(run, tmp_path / "api")
    cli, api = _files(tmp_path / "cli"), _files(tmp_path / "api")
    assert cli.keys() == api.keys()
    assert {"power_envelope.csv", "kernels_by_phase.csv", "ranges.parquet"} <= cli.keys()
    differ = sorted(name for name in cli if cli[name] != api[name])
    assert differ == ["summary.json"]  # its provenance: the command's line and own option
    c, a = (json.loads(files["summary.json"]) for files in (cli, api))
    assert c["provenance"].pop("command_line")[:2] == ["nvtx-phases", "analyze"]
    assert a["provenance"].pop("command_line") is None
    assert c["provenance"]["options"].pop("top_kernels") == 10
    for summary in (c, a):  # when each was analyzed
        summary["provenance"].pop("analyzed_at_utc")
    assert c == a


def test_write_outputs_to_an_unwritable_place_is_one_line(tmp_path):
    from nvtx_phases.analysis.errors import OutputError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with analyze([SAMPLE]) as run, pytest.raises(OutputError, match="not a folder"):
        write_outputs(run, blocker / "out")


def test_every_analysis_field_is_a_registry_table_and_round_trips(tmp_path):
    from nvtx_phases.analysis.render.outputs.tables import TABLES

    fields = {f.name for f in dataclasses.fields(Analysis)} - {"workdir", "notes"}
    assert fields == {t.field for t in TABLES if t.field}
    with analyze([SAMPLE]) as run:
        write_outputs(run, tmp_path)
        back = load_analysis(tmp_path)
        for name in fields - {"gpu_activity", "summary"}:
            ours, saved = getattr(run, name), getattr(back, name)
            assert (ours is None) == (saved is None), name
        assert back.summary == run.summary
        assert back.gpu_activity.collect().height == run.summary.gpu.n_gpu_ops


def test_steps_select_every_per_step_table():
    from nvtx_phases.analysis.render.outputs.tables import TABLES
    from nvtx_phases.analysis.run.select import select_steps

    with analyze([SAMPLE]) as run:
        chosen = select_steps(run, "2")
        for table in TABLES:
            frame = getattr(chosen, table.field) if table.field else None
            if isinstance(frame, pl.DataFrame) and "step" in frame.columns:
                steps = set(frame["step"].drop_nulls())
                assert steps <= {2}, table.name


def test_option_values_of_the_wrong_type_are_one_line():
    from nvtx_phases.analysis.errors import InputError
    from nvtx_phases.analysis.options import AnalyzeOptions

    power = SAMPLES / "grpo_synthetic.power.parquet"
    assert AnalyzeOptions(power_files=str(power)).power_files == (power,)  # one file
    cases = [
        ({"steps": 2}, "steps: expected"),
        ({"jobs": "4"}, "jobs: expected an integer"),
        ({"idle_power_w": "abc"}, "idle_power_w: expected"),
        ({"engine": "dask"}, "engine: expected"),
        ({"all_ranges": "no"}, "all_ranges: expected True or False"),
        ({"power_files": [1]}, "power_files: expected"),
    ]
    for fields, message in cases:
        with pytest.raises(InputError, match=message):
            AnalyzeOptions(**fields)
    with pytest.raises(InputError, match="expected an AnalyzeOptions, got dict"):
        analyze(SAMPLE, {"all_ranges": True})
    with pytest.raises(InputError, match="no input"):
        analyze([])
