"""GPU metric samples (nsys ``--gpu-metrics-devices``) added to a synthetic GRPO export.

The tables are created from the DDL of a real nsys 2023.4.4 export
(``schema/nsys-gpu-metrics-2023.4.4.sql``: ``GPU_METRICS``, ``TARGET_INFO_GPU_METRICS`` and, when
GPUs are to be named by UUID, ``TARGET_INFO_GPU``), never from invented columns, and filled from
a known metric model: on GPU ``r`` (rank ``r``'s), each metric holds a constant value while one of
that rank's worker ranges runs (:data:`DEFAULT_MODEL`: SM Active 80 % in ``update_actor``, 30 %
in ``generate_sequences``, …) and cycles through its idle values elsewhere. Samples are taken
every ``interval_ns`` on each GPU (GPU ``r`` ``r × gpu_offset_ns`` later), except inside
``dropouts`` (as nsys leaves gaps when its buffer overflows).

``typeId`` is ``(1 << 48) | (1 << 32) | r`` and ``sourceId`` its GPU-0 value, with an empty
``typeName``: what a real nsys 2023.4.4 export of an H200 holds (``typeId`` 281479271677952
for GPU 0). Only the low byte is read (the GPU's ``TARGET_INFO_GPU.id``: NVIDIA's recipes read
``typeId & 0xFF``). ``metricId`` follows the model's order, or a per-GPU permutation
(``shuffle_seed``), since nsys does not keep metric ids stable.

The samples written are returned on the run clock: the ground truth, computed by brute force
in the tests, independently of :mod:`analysis`.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import polars as pl

from .build import generate
from .config import WORKER_PID0, SynthConfig
from .constants import US, VM_ID
from .model import GrpoBuilder
from .schema import insert

_CREATE = r"(CREATE TABLE (\w+) \(.*?\n\);)"
_SCHEMA_FILE = "nsys-gpu-metrics-2023.4.4.sql"
_TYPE_BASE = VM_ID | (1 << 32)
_INFO_COLUMNS = ("typeId", "sourceId", "typeName", "metricId", "metricName")
_GPU_COLUMNS = ("vmId", "id", "name", "busLocation", "uuid", "chipName", "cuDevice")


@dataclass(frozen=True)
class MetricModel:
    """One metric: its nsys name, its value inside each worker range, its idle values."""

    name: str
    by_range: dict[str, int]
    #: values outside every worker range, cycled sample by sample
    idle: tuple[int, ...] = (0,)


DEFAULT_MODEL: tuple[MetricModel, ...] = (
    MetricModel(
        "SM Active [Throughput %]",
        {
            "generate_sequences": 30,
            "compute_log_prob": 60,
            "compute_ref_log_prob": 55,
            "update_actor": 80,
            "update_weights": 10,
        },
        (0, 0, 0, 2),
    ),
    MetricModel(
        "Tensor Active [Throughput %]",
        {
            "generate_sequences": 12,
            "compute_log_prob": 40,
            "compute_ref_log_prob": 38,
            "update_actor": 55,
            "update_weights": 0,
        },
    ),
    MetricModel(
        "DRAM Read Bandwidth [Throughput %]",
        {
            "generate_sequences": 70,
            "compute_log_prob": 35,
            "compute_ref_log_prob": 33,
            "update_actor": 25,
            "update_weights": 45,
        },
        (1, 0),
    ),
    # labelled MHz, recorded in Hz: as nsys 2023.4.4 wrote it on an H200 (1.98e9 at full clock)
    MetricModel(
        "GPC Clock Frequency [MHz]",
        {
            "generate_sequences": 1_755_000_000,
            "compute_log_prob": 1_980_000_000,
            "compute_ref_log_prob": 1_980_000_000,
            "update_actor": 1_830_000_000,
            "update_weights": 1_410_000_000,
        },
        (345_000_000, 345_000_000, 1_980_000_000),
    ),
)


@dataclass(frozen=True)
class GpuMetricsConfig:
    """How the synthetic GPU metrics are sampled and written."""

    interval_ns: int = 100 * US
    gpu_offset_ns: int = 7 * US
    #: [start, end) on the run clock where no GPU was sampled
    dropouts: tuple[tuple[int, int], ...] = ()
    #: permute metricIds per GPU (None: the model's order)
    shuffle_seed: int | None = None
    #: write TARGET_INFO_GPU (GPU-<uuid> names) when the export has none
    gpu_uuids: bool = False
    model: tuple[MetricModel, ...] = field(default=DEFAULT_MODEL)


def gpu_uuid(gpu: int) -> str:
    """The synthetic UUID of GPU ``gpu`` (nvidia-smi's spelling)."""
    return f"GPU-5e1f0000-0000-4000-8000-{gpu:012x}"


def metric_samples(b: GrpoBuilder, gm: GpuMetricsConfig) -> pl.DataFrame:
    """Every sample of the model on the run clock: ts_ns, gpu, metric_name, value."""
    frames = []
    for gpu in range(b.cfg.ranks):
        ts = np.arange(gpu * gm.gpu_offset_ns, b.duration, gm.interval_ns, dtype=np.int64)
        for lo, hi in gm.dropouts:
            ts = ts[(ts < lo) | (ts >= hi)]
        ranges = [w for w in b.workers if w.pid == WORKER_PID0 + gpu]
        for m in gm.model:
            values = np.asarray(m.idle, dtype=np.int64)[np.arange(ts.size) % len(m.idle)]
            for w in ranges:
                values[(ts >= w.start) & (ts < w.end)] = m.by_range.get(w.name, 0)
            frames.append(
                pl.DataFrame(
                    {"ts_ns": ts, "gpu": gpu, "metric_name": m.name, "value": values},
                    schema={
                        "ts_ns": pl.Int64,
                        "gpu": pl.Int64,
                        "metric_name": pl.String,
                        "value": pl.Int64,
                    },
                )
            )
    return pl.concat(frames).sort("ts_ns", "gpu", "metric_name")


def _metric_ids(gm: GpuMetricsConfig, gpu: int) -> dict[str, int]:
    """The ``metricId`` of each metric name on GPU ``gpu``."""
    order = list(range(len(gm.model)))
    if gm.shuffle_seed is not None:
        order = [int(i) for i in np.random.default_rng(gm.shuffle_seed + gpu).permutation(order)]
    return {m.name: 3 * i + 1 for m, i in zip(gm.model, order, strict=True)}


def _ddl(tables: set[str]) -> str:
    text = (
        resources.files("nvtx_phases.analysis.synth").joinpath(f"schema/{_SCHEMA_FILE}").read_text()
    )
    return "\n".join(s for s, name in re.findall(_CREATE, text, flags=re.S) if name in tables)


def write_gpu_metrics(
    export: str | Path, cfg: SynthConfig, gm: GpuMetricsConfig | None = None
) -> pl.DataFrame:
    """Add GPU metrics to ``export``, a one-file export :func:`generate` wrote with ``cfg``.

    Returns the samples written (their ``ts_ns`` are the file's timestamps: one file's session
    clock is the run clock).
    """
    if cfg.split_files:
        msg = "GPU metrics are written into a one-file export (split_files=False)"
        raise ValueError(msg)
    gm = gm or GpuMetricsConfig()
    b = GrpoBuilder(cfg)
    b.build()
    samples = metric_samples(b, gm)
    con = sqlite3.connect(export)
    try:
        present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        tables = {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"}
        if gm.gpu_uuids and "TARGET_INFO_GPU" not in present:
            tables.add("TARGET_INFO_GPU")
        con.executescript(_ddl(tables))
        _write_rows(con, cfg, gm, samples, with_gpus="TARGET_INFO_GPU" in tables)
        con.commit()
    finally:
        con.close()
    return samples


def _write_rows(
    con: sqlite3.Connection,
    cfg: SynthConfig,
    gm: GpuMetricsConfig,
    samples: pl.DataFrame,
    *,
    with_gpus: bool,
) -> None:
    ids = {gpu: _metric_ids(gm, gpu) for gpu in range(cfg.ranks)}
    info = [
        (_TYPE_BASE | gpu, _TYPE_BASE, "", metric_id, name)
        for gpu in range(cfg.ranks)
        for name, metric_id in ids[gpu].items()
    ]
    con.executemany(insert("TARGET_INFO_GPU_METRICS", _INFO_COLUMNS), info)
    rows = (
        (ts, _TYPE_BASE | gpu, ids[gpu][name], value)
        for ts, gpu, name, value in samples.iter_rows()
    )
    con.executemany(insert("GPU_METRICS", ("timestamp", "typeId", "metricId", "value")), rows)
    if with_gpus:
        gpus = [
            (
                VM_ID,
                gpu,
                "NVIDIA A100-SXM4-80GB",
                f"0000:{gpu + 7:02x}:00.0",
                gpu_uuid(gpu),
                "GA100",
                gpu,
            )
            for gpu in range(cfg.ranks)
        ]
        con.executemany(insert("TARGET_INFO_GPU", _GPU_COLUMNS), gpus)


def generate_with_gpu_metrics(
    out: str | Path, cfg: SynthConfig | None = None, gm: GpuMetricsConfig | None = None
) -> tuple[Path, pl.DataFrame]:
    """:func:`generate` one export at ``out`` (a ``.sqlite`` path), then add GPU metrics.

    Returns the export and the samples written (:func:`write_gpu_metrics`).
    """
    cfg = cfg or SynthConfig()
    (path,) = generate(out, cfg)
    return path, write_gpu_metrics(path, cfg, gm)
