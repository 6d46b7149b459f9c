"""The marking API and the JSONL recorder, through the built-in workload (no profiler needed)."""

import threading
from collections import Counter

import polars as pl

from nvtx_phases import marking
from nvtx_phases.marking import phase, record_to, step
from nvtx_phases.workload import expected_paths, run_step


def test_workload_ranges_paths_and_steps(tmp_path):
    out = tmp_path / "ranges.jsonl"
    with record_to(out):
        for index in (5, 6):
            run_step(index)
    records = pl.read_ndjson(out)
    assert Counter(records["path"].to_list()) == expected_paths(2)
    assert set(records["step"].to_list()) == {5, 6}
    assert set(records["domain"]) == {"nvtx_phases"}
    # children close before parents and lie inside them
    steps = records.filter(pl.col("name") == "step").sort("start_mono_ns")
    inner = records.filter((pl.col("name") != "step") & (pl.col("step") == 5))
    first = steps.row(0, named=True)
    assert (inner["start_mono_ns"] >= first["start_mono_ns"]).all()
    assert (inner["start_mono_ns"] + inner["dur_ns"] <= first["end_mono_ns"]).all()


def test_decorator_and_threads_keep_separate_stacks(tmp_path):
    @phase("compute_log_prob")
    def work():
        with phase("forward"):
            pass

    out = tmp_path / "r.jsonl"
    with record_to(out):
        with step(3):
            work()
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    records = pl.read_ndjson(out).select("path", "step")
    assert sorted(records.rows(), key=str) == sorted(
        [
            ("step/compute_log_prob/forward", 3),
            ("step/compute_log_prob", 3),
            ("step", 3),
            ("compute_log_prob/forward", None),  # another thread: its own, empty stack
            ("compute_log_prob", None),
        ],
        key=str,
    )


def test_no_recorder_no_file(tmp_path, monkeypatch):
    monkeypatch.delenv(marking.JSONL_ENV, raising=False)
    with step(1), phase("gen"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_async_phases_keep_their_own_nesting_and_step(tmp_path):
    import asyncio

    @phase("generate_sequences")
    async def rollout(delay: float) -> None:
        with phase("generation"):
            await asyncio.sleep(delay)

    async def main() -> None:
        with step(9):
            await asyncio.gather(rollout(0.02), rollout(0.01))

    out = tmp_path / "a.jsonl"
    with record_to(out):
        asyncio.run(main())
    records = pl.read_ndjson(out)
    assert Counter(records["path"].to_list()) == {
        "step": 1,
        "step/generate_sequences": 2,
        "step/generate_sequences/generation": 2,
    }
    assert set(records["step"]) == {9}


def test_step_goes_to_payload_or_category():
    attrs = marking.nvtx_attributes("gen", 4, "nvtx_phases")
    if marking.PAYLOAD_SUPPORTED:
        assert attrs["payload"] == 4
    else:
        assert attrs["category"] == 4
    assert (
        "category" not in marking.nvtx_attributes("gen", 4, "other_domain")
        or marking.PAYLOAD_SUPPORTED
    )
    assert "category" not in marking.nvtx_attributes("gen", 0, "nvtx_phases")
