"""Memory-bounded analysis: spilled, bucketed runs give exactly the single-pass result."""

import sys

import polars as pl
import pytest
from nvtx_phases.analysis.aggregate.activity_writer import ActivityWriter
from nvtx_phases.analysis.errors import OutputError
from nvtx_phases.analysis.run.pipeline import analyze, bucket_edges
from nvtxp_testkit import SAMPLES, SPLIT_SAMPLE, assert_same_analysis, shared_trace


@pytest.mark.parametrize(
    "paths",
    [
        [SAMPLES / "grpo_synthetic.sqlite"],
        SPLIT_SAMPLE,
        # names, resolved inside the test: a missing ../shared skips these cases, not the module
        ["nsysai_h100_2gpu_1s.sqlite"],
        ["pipit_cloverleaf_4xA100_nsys2024.5.sqlite"],
    ],
    ids=["power", "split-files", "h100-nccl", "a100-4gpu"],
)
def test_spilled_buckets_equal_one_pass(paths, tmp_path):
    paths = [shared_trace(p) if isinstance(p, str) else p for p in paths]
    whole = analyze(paths)
    assert whole.summary.to_dict()["n_buckets"] == 1
    assert whole.workdir is None  # held in memory: nothing to clean up
    bucketed = analyze(paths, chunk_ops=300, spill_dir=tmp_path)
    n_ops = whole.summary.to_dict()["n_gpu_ops"]
    assert bucketed.summary.to_dict()["n_buckets"] == -(-n_ops // 300)
    assert bucketed.workdir is not None and bucketed.workdir.parent == tmp_path
    assert_same_analysis(whole, bucketed, ignore_summary=("n_buckets",))
    if whole.summary.to_dict()["power_source"]:
        assert whole.summary.to_dict()["idle_power_w"] == bucketed.summary.to_dict()["idle_power_w"]
    # spilled operations are gone once analyze returns; the activity parts live until close()
    assert [p.name for p in tmp_path.iterdir()] == [next(tmp_path.iterdir()).name]
    assert not list(tmp_path.glob("*/ops"))
    with bucketed:
        assert bucketed.gpu_activity.select(pl.len()).collect().item() == n_ops
    assert list(tmp_path.iterdir()) == []


def test_bucket_edges_split_the_sample_into_equal_counts():
    sample = pl.Series("start_ns", list(range(100)))
    assert bucket_edges([sample], n_ops=1000, chunk_ops=1000) == [(None, None)]
    assert bucket_edges([sample[:50], sample[50:]], n_ops=1000, chunk_ops=250) == [
        (None, 25),
        (25, 50),
        (50, 75),
        (75, None),
    ]


def test_spilled_reads_in_a_process_pool_equal_one_pass(tmp_path):
    whole = analyze(SPLIT_SAMPLE)
    pooled = analyze(SPLIT_SAMPLE, jobs=3, engine="process", chunk_ops=300, spill_dir=tmp_path)
    assert pooled.summary.to_dict()["n_buckets"] > 1
    assert_same_analysis(whole, pooled, ignore_summary=("n_buckets",))


def test_bucketed_activity_is_one_file_copied_whole_or_streamed_when_filtered(tmp_path):
    from nvtx_phases.analysis.render.outputs.files import write_outputs
    from nvtx_phases.analysis.run.select import select_steps
    from polars.testing import assert_frame_equal

    sample = SAMPLES / "grpo_synthetic.sqlite"
    with analyze([sample]) as whole, analyze([sample], chunk_ops=300, spill_dir=tmp_path) as parts:
        assert parts.workdir is not None
        assert len(list((parts.workdir / "activity").iterdir())) == 1
        write_outputs(whole, tmp_path / "one")
        write_outputs(parts, tmp_path / "many")
        write_outputs(select_steps(parts, "2"), tmp_path / "step2")
        one = pl.read_parquet(tmp_path / "one" / "gpu_activity.parquet")
        # bucketed rows come bucket by bucket (time order), as the per-bucket parts did
        many = pl.read_parquet(tmp_path / "many" / "gpu_activity.parquet").sort("op_id")
        step2 = pl.read_parquet(tmp_path / "step2" / "gpu_activity.parquet").sort("op_id")
        assert_frame_equal(one, many)
        assert_frame_equal(one.filter(pl.col("window_step") == 2), step2)


def test_activity_writer_keeps_frames_in_order_on_its_thread(tmp_path):
    path = tmp_path / "activity.parquet"
    writer = ActivityWriter(path)
    for lo in range(0, 300_000, 100_000):
        writer.write(pl.DataFrame({"op_id": pl.int_range(lo, lo + 100_000, eager=True)}))
    writer.close()
    writer.close()  # idempotent
    assert pl.read_parquet(path)["op_id"].to_list() == list(range(300_000))


def test_activity_writer_error_reaches_the_caller(tmp_path):
    writer = ActivityWriter(tmp_path / "gone" / "activity.parquet")  # no such folder
    writer.write(pl.DataFrame({"op_id": [1, 2]}))
    with pytest.raises(OutputError, match=r"spill folder .*gone: cannot write activity\.parquet"):
        writer.close()


def test_activity_writer_without_pyarrow_raises_instead_of_waiting(tmp_path, monkeypatch):
    # pyarrow made unimportable: the thread must still take every frame, so no write() hangs
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    writer = ActivityWriter(tmp_path / "activity.parquet")
    with pytest.raises(ImportError):  # at a write or at close, as the thread's import falls
        for op_id in range(3):
            writer.write(pl.DataFrame({"op_id": [op_id]}))
        writer.close()
    with pytest.raises(ImportError):
        writer.close()
