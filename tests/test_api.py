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
