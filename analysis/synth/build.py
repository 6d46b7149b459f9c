"""A synthetic VeRL-like GRPO run written as real Nsight Systems 2022.4 SQLite exports.

The tables are created from the DDL of a real 2022.4.2 export (``schema/nsys-schema-2022.4.2.sql``,
with its ENUM rows), never from invented columns, so NVIDIA's own ``nsys stats`` reports run on
the result. One driver process marks ``step`` (int64 payload = step number) and the trainer
phases in domain ``verl`` with registered strings; each worker rank marks VeRL's worker phases
with plain text and launches kernels, NCCL collectives, memcpys and memsets on its own GPU.

Deliberate features, each with ground truth: a generation kernel that runs past the end of
``gen`` (split by the window scheme), NCCL kernels on a second stream overlapping compute
(busy time counts overlap once), GPU-free phases (``reward``, ``adv``), warm-up kernels before
the first step (unattributed), response-length skew across ranks, and optionally one file per
process with different session start times (clock alignment). With ``graphs=True`` most decode
kernels of ``generate_sequences`` run as CUDA graph executions instead (``nsys profile
--cuda-graph-trace=graph``: rows of ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``, DDL of nsys 2024.x in
``schema/nsys-graph-trace-2024.sql``, launched by ``cudaGraphLaunch_v10000`` runtime calls), one
of them straddling the ``gen`` boundary. :mod:`analysis.synth.ray` builds a Ray-style capture
(one export per process, two processes sharing each GPU) from the same parts.

The ground truth is computed by brute force from the generated operation list (numpy clipping
per range), independently of :mod:`analysis`.

This module writes the files (:func:`generate`); the run itself is laid out in
:mod:`analysis.synth.model`, written by :mod:`analysis.synth.export` and checked by
:mod:`analysis.synth.truth`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .config import WORKER_PID0, SynthConfig
from .constants import BASE_UTC_NS, DRIVER_PID
from .export import MEMORY_TABLE, ExportFile, Process, write_export
from .lengths import write_lengths
from .memory import MemoryEvent, memory_events
from .model import GrpoBuilder
from .schema import TABLES
from .truth import ground_truth

_GENERATED_BY = "nvtx-phases analysis.synth (synthetic VeRL-like GRPO run)"


def generate(
    out: str | Path, cfg: SynthConfig | None = None, *, with_truth: bool = True
) -> list[Path]:
    """Write the synthetic run and its ground truth; return the export paths.

    One export when ``out`` is a ``.sqlite`` path, or one per process with ``cfg.split_files``
    (``out`` is then a folder). The ground truth JSON is written beside the export(s).
    """
    cfg = cfg or SynthConfig()
    b = GrpoBuilder(cfg)
    b.build()
    memory = memory_events(b, cfg.ranks) if cfg.memory else None
    out = Path(out)
    duration = b.duration
    pids = [DRIVER_PID] + [WORKER_PID0 + r for r in range(cfg.ranks)]
    written: list[Path] = []
    if cfg.split_files:
        out.mkdir(parents=True, exist_ok=True)
        for i, pid in enumerate(pids):
            shift = i * cfg.file_start_stagger_ns  # this process's capture started later
            name = "driver" if pid == DRIVER_PID else f"worker_rank{pid - WORKER_PID0}"
            written.append(out / f"{name}.sqlite")
            _write_file(written[-1], b, [pid], shift, duration - shift, memory)
        truth_path = out / "ground_truth.json"
        power_path = out / "power_synthetic.parquet"
        lengths_dir = out / "lengths"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_file(out, b, pids, 0, duration, memory)
        written.append(out)
        truth_path = out.with_name(out.stem + ".ground_truth.json")
        power_path = out.with_name(out.stem + ".power.parquet")
        lengths_dir = out.with_name(out.stem + "_lengths")
    if cfg.lengths:
        write_lengths(cfg, lengths_dir)
    if cfg.power:
        _write_power(b, power_path)
    if with_truth:
        config = asdict(cfg)
        for added in ("graphs", "memory"):  # added later: absent when off, so older ground
            if not config[added]:  # truths stay as they are
                del config[added]
        truth = {"config": config, **ground_truth(b, memory)}
        truth_path.write_text(json.dumps(truth, indent=1) + "\n")
    return written


def _process_name(pid: int) -> str:
    if pid == DRIVER_PID:
        return "python3 main_ppo.py (driver)"
    return f"ray::WorkerDict rank {pid - WORKER_PID0}"


def _write_file(
    path: Path,
    b: GrpoBuilder,
    pids: list[int],
    shift_ns: int,
    duration: int,
    memory: list[MemoryEvent] | None,
) -> None:
    """Write the events of ``pids`` to one export whose session starts ``shift_ns`` late.

    ``memory``: the run's CUDA memory events (None: no ``CUDA_GPU_MEMORY_USAGE_EVENTS`` table).
    """
    launch_kinds = ("kernel", "memcpy", "memset", *(["graph"] if b.cfg.graphs else []))
    spec = ExportFile(
        processes=tuple(Process(p, _process_name(p), ((p, _process_name(p)),)) for p in pids),
        tables=TABLES if memory is None else TABLES | {MEMORY_TABLE},
        shift_ns=shift_ns,
        session_utc_ns=BASE_UTC_NS + shift_ns,
        session_iso="",
        duration_ns=duration,
        host="synthetic",
        generated_by=_GENERATED_BY,
        env=(("Hostname", 619, "synthetic"),),
        launch_kinds=launch_kinds,
        grid_x=108,  # an A100's SMs
        local_device=False,  # one process sees all GPUs of the run: deviceId = rank
    )
    write_export(path, spec, b, clock_marks=b.cfg.power, memory=memory or ())


def _write_power(b: GrpoBuilder, path: Path) -> None:
    """The NVML-style samples as an older sampler's Parquet (no ``uuid`` column)."""
    import polars as pl

    small_ints = ("device", "sm_clock_mhz", "gpu_util_pct", "mem_util_pct")
    frame = pl.DataFrame(b.power_samples()).cast({c: pl.Int32 for c in small_ints})
    frame.write_parquet(path)


__all__ = ["TABLES", "SynthConfig", "generate", "ground_truth", "write_lengths"]
