"""Say, from inside a process, which GPU pool it belongs to and what samples a step trained on.

Disaggregated RL runs a trainer and a rollouter on separate GPU pools; the analysis attributes
a driver-side phase only the GPU work of its own pool's GPUs. A process tells it which pool is
its own with one NVTX mark (:func:`mark_pool`), typically at start-up: the controller processes
(VeRL's ``FullyAsyncTrainer`` and ``FullyAsyncRollouter`` actors) with their role only, the worker
processes with their role and the GPUs they drive. The asynchronous trainer marks, per step,
the parameter versions its samples were generated with (:func:`mark_samples`), from which the
analysis reads staleness. Without a profiler attached, marks are no-ops.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import nvtx

from nvtx_phases.naming import DOMAIN, pool_mark_text, samples_mark_text


def mark_pool(role: str, gpus: Iterable[str] | None = None) -> str:
    """Emit this process's pool mark; returns its text.

    ``gpus``: the UUIDs (``GPU-…``) of the GPUs this process drives; None: found with
    :func:`visible_gpu_uuids` (none on a machine without a GPU, or without NVML).
    """
    found = visible_gpu_uuids() if gpus is None else list(gpus)
    text = pool_mark_text(role, tuple(found))
    nvtx.mark(text, domain=DOMAIN)
    return text


def mark_samples(step: int, version: int, sample_versions: Mapping[int, int]) -> str:
    """Emit the mark of one trainer step: its parameter ``version`` and its samples' versions."""
    text = samples_mark_text(step, version, dict(sample_versions))
    nvtx.mark(text, domain=DOMAIN)
    return text


def visible_gpu_uuids() -> list[str]:
    """UUIDs (``GPU-…``) of the GPUs this process can see, through NVML; [] when there are none.

    ``CUDA_VISIBLE_DEVICES`` is honoured when it lists indices or UUIDs (Ray sets indices).
    """
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: nothing to name
        return []
    try:
        every = [
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return every
    chosen = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit() and int(item) < len(every):
            chosen.append(every[int(item)])
        elif item.startswith("GPU-"):
            chosen.extend(u for u in every if u.startswith(item))
    return chosen


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
