"""GPU metrics per phase and GPU (issue 15, item 2), against a synthetic export with a known
metric model (tables with the DDL of a real nsys 2023.4.4 export) and brute-force truth."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import numpy as np
import nvtx_phases.analysis.aggregate.gpu_metrics as agg
import polars as pl
import pytest
from nvtx_phases.analysis import analyze
from nvtx_phases.analysis.aggregate.gpu_metrics import (
    TABLE_SCHEMA,
    gpu_metrics_per_phase,
    projection_devices,
)
from nvtx_phases.analysis.model import PROJECTION, WINDOW
from nvtx_phases.analysis.normalize.gpu_metrics import (
    read_gpu_metrics,
    read_run_gpu_metrics,
    split_metric_name,
)
from nvtx_phases.analysis.render.outputs.tables import BY_NAME
from nvtx_phases.analysis.synth import SynthConfig, generate
from nvtx_phases.analysis.synth.config import WORKER_PID0
from nvtx_phases.analysis.synth.constants import US
from nvtx_phases.analysis.synth.gpu_metrics import (
    DEFAULT_MODEL,
    GpuMetricsConfig,
    generate_with_gpu_metrics,
    gpu_uuid,
)
from nvtx_phases.analysis.synth.model import GrpoBuilder
from polars.testing import assert_frame_equal

CSV_NAME = "gpu_metrics_per_phase.csv"

CFG = SynthConfig(power=False, lengths=False)
METRICS = {"SM Active", "Tensor Active", "DRAM Read Bandwidth"}  # the model's, read by default


def _adv_of_step(step: int) -> tuple[int, int]:
    b = GrpoBuilder(CFG)
    b.build()
    (adv,) = [r for r in b.driver if r.name == "adv" and r.step == step]
    return adv.start, adv.end


def _table(path, *, rows: int = 1_000_000):
    with analyze([path], power_files=[]) as result:
        metrics = read_run_gpu_metrics(result.summary.traces)
        table = gpu_metrics_per_phase(
            result.phases,
            metrics.samples(rows),
            metrics.available,
            projection_devices(result.gpu_activity, result.phases),
        )
        return table, result.phases, metrics.notes


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The synthetic run with GPU metrics; no sample during step 2's ``adv`` (a dropout)."""
    start, end = _adv_of_step(2)
    gm = GpuMetricsConfig(dropouts=((start - 50 * US, end + 50 * US),))
    path, truth = generate_with_gpu_metrics(
        tmp_path_factory.mktemp("plain") / "run.sqlite", CFG, gm
    )
    table, phases, notes = _table(path)
    return {
        "path": path,
        "truth": truth,
        "table": table,
        "phases": phases,
        "notes": notes,
        "gm": gm,
    }


def _device(gpu: int) -> str:
    return f"run:{gpu}"  # no TARGET_INFO_GPU: named by file and device id, like the operations


def test_every_row_matches_brute_force(run):
    truth, table = run["truth"], run["table"]
    checked = 0
    for row in table.iter_rows(named=True):
        gpu = int(row["device"].rsplit(":", 1)[1])
        name = next(m.name for m in DEFAULT_MODEL if m.name.startswith(row["metric"] + " ["))
        inside = truth.filter(
            (pl.col("gpu") == gpu)
            & (pl.col("metric_name") == name)
            & (pl.col("ts_ns") >= row["start_ns"])
            & (pl.col("ts_ns") < row["end_ns"])
        )["value"].to_numpy()
        assert row["n_samples"] == inside.size, row
        if inside.size == 0:
            assert row["mean"] is None and row["p95"] is None, row
            continue
        assert row["mean"] == pytest.approx(inside.mean(), rel=1e-12, abs=1e-12), row
        assert row["p95"] == pytest.approx(np.percentile(inside, 95), rel=1e-12, abs=1e-12), row
        assert (row["min"], row["max"]) == (inside.min(), inside.max()), row
        checked += 1
    assert checked > 100


def test_rows_and_gpus_follow_the_attribution(run):
    table, phases = run["table"], run["phases"]
    assert set(table["metric"]) == METRICS
    assert set(table["unit"]) == {"Throughput %"}
    # window phases: every sampled GPU; projection phases: their rank's GPU only
    window = table.filter(pl.col("attribution") == WINDOW)
    assert set(window["device"]) == {_device(0), _device(1)}
    proj = table.filter(pl.col("attribution") == PROJECTION)
    assert (proj["device"] == ("run:" + (proj["pid"] - WORKER_PID0).cast(pl.String))).all()
    n_window = phases.filter(pl.col("attribution") == WINDOW).height
    n_proj = phases.filter(pl.col("attribution") == PROJECTION).height
    assert table.height == (2 * n_window + n_proj) * len(METRICS)


def test_projection_phases_show_the_model_exactly(run):
    table = run["table"].filter(pl.col("attribution") == PROJECTION)
    for metric in DEFAULT_MODEL[:3]:
        short = metric.name.split(" [")[0]
        for phase, value in metric.by_range.items():
            rows = table.filter((pl.col("phase") == phase) & (pl.col("metric") == short))
            assert rows.height == 2 * CFG.steps, (phase, short)
            assert (rows["n_samples"] > 0).all()
            assert rows["mean"].to_list() == [float(value)] * rows.height, (phase, short)
            assert rows["p95"].to_list() == [float(value)] * rows.height, (phase, short)
    # SM Active 80 % in update_actor, 30 % in generation (the brief's example)
    sm = table.filter(pl.col("metric") == "SM Active")
    assert set(sm.filter(pl.col("phase") == "update_actor")["mean"]) == {80.0}
    assert set(sm.filter(pl.col("phase") == "generate_sequences")["mean"]) == {30.0}


def test_window_gen_shows_the_short_rank_idling(run):
    gen = run["table"].filter(
        (pl.col("path") == "step/gen") & (pl.col("metric") == "SM Active") & (pl.col("step") == 1)
    )
    means = dict(zip(gen["device"], gen["mean"], strict=True))
    assert means[_device(1)] < means[_device(0)] < 30.0  # rank 1 finishes generating first


def test_a_phase_with_no_sample_is_kept_and_flagged(run):
    adv = run["table"].filter((pl.col("path") == "step/adv") & (pl.col("step") == 2))
    assert adv.height == 2 * len(METRICS)  # every GPU and metric: kept, not dropped
    assert adv["n_samples"].to_list() == [0] * adv.height
    assert adv["mean"].null_count() == adv["p95"].null_count() == adv.height
    others = run["table"].filter((pl.col("path") == "step/adv") & (pl.col("step") != 2))
    assert (others["n_samples"] > 0).all()


def test_metrics_are_matched_by_name_when_ids_are_shuffled(run, tmp_path):
    gm = replace(run["gm"], shuffle_seed=3)
    path, truth = generate_with_gpu_metrics(tmp_path / "run.sqlite", CFG, gm)
    assert truth.equals(run["truth"])
    ids = {}
    for p in (run["path"], path):
        with sqlite3.connect(p) as con:
            ids[p] = sorted(
                con.execute("SELECT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS")
            )
    assert ids[path] != ids[run["path"]]  # same names, other ids
    assert {r[1] for r in ids[path] if r[0] & 0xFF == 0} == {
        r[1] for r in ids[path] if r[0] & 0xFF == 1
    }
    by_id = {(r[0], r[1]): r[2] for r in ids[path]}
    assert any(by_id[(t, m)] != n for t, m, n in ids[run["path"]] if (t, m) in by_id)
    table, _, _ = _table(path)
    assert_frame_equal(table, run["table"])


def test_export_without_gpu_metrics_gives_an_empty_table_and_a_note(tmp_path):
    (path,) = generate(tmp_path / "plain.sqlite", CFG, with_truth=False)
    table, _, notes = _table(path)
    assert table.is_empty() and table.schema == pl.Schema(TABLE_SCHEMA)
    assert len(notes) == 1 and "no GPU metrics" in notes[0] and "--gpu-metrics-devices" in notes[0]
    assert BY_NAME[CSV_NAME].skip_empty  # an empty table is not written
    samples, available, single = read_gpu_metrics(path)
    assert samples.is_empty() and available.is_empty() and "no GPU_METRICS table" in single[0]


def test_every_metric_can_be_read_with_its_unit(run):
    samples, available, notes = read_gpu_metrics(run["path"], metrics=None)
    assert "not in TARGET_INFO_GPU" in notes[0]
    units = dict(zip(available["metric"], available["unit"], strict=False))
    assert units == {
        "SM Active": "Throughput %",
        "Tensor Active": "Throughput %",
        "DRAM Read Bandwidth": "Throughput %",
        "GPC Clock Frequency": "MHz",  # the name's unit; the values are Hz, as nsys writes them
    }
    clock = samples.filter(pl.col("metric") == "GPC Clock Frequency").sort("ts_ns", "device")
    expected = run["truth"].filter(pl.col("metric_name") == "GPC Clock Frequency [MHz]")
    assert clock["value"].to_list() == expected["value"].cast(pl.Float64).to_list()
    assert clock["ts_ns"].to_list() == expected["ts_ns"].to_list()


def test_gpus_named_by_uuid_meet_the_operations(tmp_path):
    path, _ = generate_with_gpu_metrics(
        tmp_path / "run.sqlite", CFG, GpuMetricsConfig(gpu_uuids=True)
    )
    table, _, notes = _table(path)
    assert notes == []
    assert set(table["device"]) == {gpu_uuid(0), gpu_uuid(1)}
    proj = table.filter(pl.col("attribution") == PROJECTION)
    assert proj.height == 2 * 5 * CFG.steps * len(METRICS)  # each worker range on its own GPU


def test_unwanted_metrics_only_is_said(run):
    with analyze([run["path"]], power_files=[]) as result:
        none = read_run_gpu_metrics(result.summary.traces, metrics=["NVLink RX Bandwidth"])
    assert none.sources == [] and none.available.is_empty()
    assert "hold none of NVLink RX Bandwidth" in none.notes[-2]
    assert "no usable GPU metrics" in none.notes[-1]


def test_a_gpu_sampled_in_two_files_counts_once(run):
    with analyze([run["path"]], power_files=[]) as result:
        (trace,) = result.summary.traces
    twice = read_run_gpu_metrics([trace, replace(trace, label="run")])
    assert len(twice.sources) == 1
    assert any("also sampled in run" in n for n in twice.notes)


def test_small_batches_and_merges_give_the_same_table(run, monkeypatch):
    monkeypatch.setattr(agg, "_MERGE_ROWS", 50)
    table, _, _ = _table(run["path"], rows=997)
    assert_frame_equal(table, run["table"])


def test_projection_devices_need_the_whole_activity_table(run):
    with analyze([run["path"]], power_files=[]) as result:
        trimmed = result.gpu_activity.select("pid", "device", "dur_ns")
        with pytest.raises(ValueError, match="projection_path"):
            projection_devices(trimmed, result.phases)


def test_csv_holds_the_table(run, tmp_path):
    written = tmp_path / CSV_NAME
    BY_NAME[CSV_NAME].write(run["table"], written)
    back = pl.read_csv(written)
    assert back.columns == list(TABLE_SCHEMA) and back.height == run["table"].height


def test_statistics_on_a_tiny_frame():
    phases = pl.DataFrame(
        {
            "trace": ["t", "t"],
            "pid": [1, 1],
            "step": [0, 0],
            "path": ["a", "a/b"],
            "phase": ["a", "b"],
            "attribution": [WINDOW, WINDOW],
            "start_ns": [0, 10],
            "end_ns": [100, 20],
        }
    )
    values = [3.0, 7.0, 1.0, 9.0, 4.0, 4.0, 100.0]
    samples = pl.DataFrame(
        {
            "ts_ns": [0, 10, 15, 19, 50, 99, 100],  # 100: at the end, outside [0, 100)
            "device": "g",
            "metric": "SM Active",
            "value": values,
        }
    )
    available = pl.DataFrame({"device": ["g"], "metric": ["SM Active"], "unit": ["Throughput %"]})
    none = pl.DataFrame(
        schema={
            "trace": pl.String,
            "pid": pl.Int64,
            "step": pl.Int64,
            "path": pl.String,
            "device": pl.String,
        }
    )
    table = gpu_metrics_per_phase(phases, samples, available, none)
    outer, inner = table.sort("start_ns").iter_rows(named=True)
    for row, inside in ((outer, values[:6]), (inner, values[1:4])):
        assert row["n_samples"] == len(inside)
        assert row["mean"] == pytest.approx(np.mean(inside), rel=1e-15)
        assert row["p95"] == pytest.approx(np.percentile(inside, 95), rel=1e-15)


@pytest.mark.parametrize(
    ("name", "metric", "unit"),
    [
        ("SM Active [Throughput %]", "SM Active", "Throughput %"),
        ("SMs Active [Throughput %]", "SM Active", "Throughput %"),
        ("GPC Clock Frequency [MHz]", "GPC Clock Frequency", "MHz"),
        ("Tensor Active", "Tensor Active", None),
    ],
)
def test_metric_names_lose_their_unit(name, metric, unit):
    bare, of = split_metric_name(pl.col("n"))
    got = pl.DataFrame({"n": [name]}).select(bare.alias("metric"), of.alias("unit"))
    assert got.row(0) == (metric, unit)
