"""The NVML sampler on a machine without a GPU, and its Parquet layout from recorded samples."""

import logging

import polars as pl

from nvtx_phases.naming import CLOCK_MARK, clock_mark_text
from nvtx_phases.power import PowerSampler


def test_without_nvml_it_says_so_once_and_records_nothing(caplog, tmp_path):
    caplog.set_level(logging.WARNING)
    with PowerSampler(interval_s=0.01) as sampler:
        pass
    assert not sampler.available
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("power:")]
    assert len(warnings) == 1 and "no power samples" in warnings[0]
    assert sampler.write_parquet(tmp_path / "p.parquet") is None
    assert not (tmp_path / "p.parquet").exists()
    sampler.stop()  # idempotent


def test_parquet_layout_from_recorded_samples(tmp_path):
    sampler = PowerSampler()
    # two samples as an H100 reported them (one GPU without an energy counter reading)
    recorded = {
        "host": ["gpu-node-7", "gpu-node-7"],
        "pid": [4242, 4242],
        "device": [0, 1],
        "uuid": ["GPU-cf6b97c0-bf53-a39e-febd-9532190b5766", None],
        "wall_ns": [1_796_000_000_000_000_000, 1_796_000_000_050_000_000],
        "mono_ns": [5_000_000_000, 5_050_000_000],
        "power_w": [412.5, 98.1],
        "energy_mj": [123_456_789, None],
        "sm_clock_mhz": [1980, 345],
        "gpu_util_pct": [100, 0],
        "mem_util_pct": [37, 0],
    }
    for column, values in recorded.items():
        sampler.samples[column].extend(values)
    path = sampler.write_parquet(tmp_path / "power.parquet")
    frame = pl.read_parquet(path)
    assert frame.schema["power_w"] == pl.Float64 and frame.schema["energy_mj"] == pl.Int64
    assert frame.to_dict(as_series=False) == recorded


def test_clock_mark_text_is_parseable():
    text = clock_mark_text(123, 456)
    assert text == f"{CLOCK_MARK} mono_ns=123 wall_ns=456"
