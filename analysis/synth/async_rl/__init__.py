"""A synthetic asynchronous (disaggregated) RL capture: a trainer pool and a rollout pool at once.

As VeRL's ``fully_async_policy`` runs under Ray and nsys (issue 28's conventions): a trainer
controller (``FullyAsyncTrainer``: ``step`` ranges with ``gen`` waiting on the sample queue,
``old_log_prob``, ``update_actor``, ``param_sync``; a samples mark per step), a rollouter
controller (``FullyAsyncRollouter``: ``version`` ranges tiling its timeline, with ``gen``,
``partial_pause``, ``staleness_wait``, ``param_sync``, ``validate``), one trainer worker per
trainer GPU (projection ranges around kernels, NCCL all-reduce in ``update_actor``, NCCL
broadcast of the weights in ``weight_sync``) and one rollout server per rollout GPU (kernels, no
ranges of its own, the broadcast's receiving side during ``param_sync``). Every process marks
its pool (:func:`nvtx_phases.pools.mark_pool`'s text, domain ``nvtx_phases``). One export per
process on its own session clock, each GPU seen as deviceId 0 (:mod:`analysis.synth.ray`'s
layout). The rollout's ``gen`` overlaps the trainer's ``update_actor``. With
``untraced_rollout`` the rollout servers' GPU operations are left out of their exports (their
processes, pool marks and power samples stay), as when nsys missed the rollout's kernels.

The ground truth (``ground_truth.json``) is computed from the exported operations by brute force
(:mod:`.truth`), independently of :mod:`analysis`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..ray import write_exports, write_truth
from .config import AsyncConfig, AsyncProcess
from .export import write_process
from .model import AsyncBuilder
from .truth import ASYNC_NOTES, async_ground_truth, idle_cause


def generate_async(
    out_dir: str | Path, cfg: AsyncConfig | None = None, *, with_truth: bool = True
) -> list[Path]:
    """Write the asynchronous capture into ``out_dir``; return the export paths.

    Files: ``trainer_controller.sqlite``, ``rollouter.sqlite``, ``trainer_gpu{g}.sqlite`` and
    ``rollout_gpu{g}.sqlite`` per GPU, ``ground_truth.json`` and, with ``cfg.power``,
    ``power_nvml.parquet``.
    """
    cfg = cfg or AsyncConfig()
    b = AsyncBuilder(cfg)
    b.build()
    out = Path(out_dir)
    written = write_exports(
        out, [(proc.file, partial(write_process, b=b, proc=proc)) for proc in b.processes]
    )
    if cfg.power:
        b.power_sampler().write_parquet(out / "power_nvml.parquet")
    if with_truth:
        write_truth(out, cfg, ASYNC_NOTES, b.processes, b.uuids, async_ground_truth(b))
    return written


__all__ = [
    "AsyncBuilder",
    "AsyncConfig",
    "AsyncProcess",
    "async_ground_truth",
    "generate_async",
    "idle_cause",
]
