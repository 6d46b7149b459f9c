"""``synth``: a synthetic VeRL-like GRPO run (or a Ray-style or asynchronous capture) as nsys exports."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from .app import app, console

RewardModel = Annotated[
    bool, typer.Option(help="Score with a reward model on the GPUs (else a CPU rule function).")
]
Lengths = Annotated[
    bool, typer.Option(help="Also write response-length records (PolyTrace layout).")
]
Split = Annotated[bool, typer.Option(help="One export per process, with staggered session starts.")]
CudaGraphs = Annotated[
    bool | None,
    typer.Option(
        "--cuda-graphs/--no-cuda-graphs",
        help="Decode steps as whole CUDA graph executions (--cuda-graph-trace=graph); "
        "default: off, on with --ray.",
    ),
]
Ray = Annotated[
    bool,
    typer.Option(
        help="Ray-style capture into folder OUT: one export per process on its own clock, "
        "a trainer and a rollout process sharing each GPU, every GPU seen as device 0."
    ),
]
Async = Annotated[
    bool,
    typer.Option(
        "--async",
        help="Asynchronous (disaggregated) RL capture into folder OUT: a trainer pool (--gpus "
        "GPUs) and a rollout pool (--rollout-gpus) working at once, one export per process, "
        "pool and samples marks, ground truth per pool.",
    ),
]
UntracedRollout = Annotated[
    bool,
    typer.Option(
        help="With --async: leave the rollout servers' GPU operations out of their exports "
        "(their processes, pool marks and power stay), as when nsys missed the rollout kernels."
    ),
]

Memory = Annotated[
    bool,
    typer.Option(
        help="Also write nsys's CUDA memory-usage table (CUDA_GPU_MEMORY_USAGE_EVENTS, as "
        "--cuda-memory-usage=true): per rank, allocations and frees with a known profile (KV "
        "cache in gen, activations in update_actor, optimizer state offloaded in "
        "update_weights) and pinned host rows that must not count; ground truth per phase "
        "row and GPU (entry, peak, time-weighted mean). Not with --ray or --async."
    ),
]


@app.command()
def synth(
    out: Annotated[Path, typer.Argument(help="Output .sqlite file (or folder with --split).")],
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 3,
    ranks: Annotated[int, typer.Option(min=1, help="Worker ranks (one GPU each).")] = 2,
    kernels: Annotated[int, typer.Option(min=2, help="Compute kernels per worker phase.")] = 40,
    seed: Annotated[int, typer.Option(help="Random seed (the run is deterministic).")] = 7,
    reward_model: RewardModel = False,
    power: Annotated[bool, typer.Option(help="Also write NVML-style power samples.")] = True,
    lengths: Lengths = True,
    split: Split = False,
    truth: Annotated[bool, typer.Option(help="Also write the ground-truth JSON.")] = True,
    cuda_graphs: CudaGraphs = None,
    ray: Ray = False,
    gpus: Annotated[
        int, typer.Option(min=1, max=8, help="GPUs of the --ray capture (--async: trainer pool's).")
    ] = 2,
    async_: Async = False,
    rollout_gpus: Annotated[
        int, typer.Option(min=1, max=7, help="GPUs of the --async capture's rollout pool.")
    ] = 2,
    untraced_rollout: UntracedRollout = False,
    memory: Memory = False,
) -> None:
    """Write a synthetic VeRL-like GRPO run as nsys 2022.4 SQLite export(s)."""
    from ..jobs import synthesize
    from ..synth.async_rl.config import AsyncConfig
    from ..synth.config import SynthConfig
    from ..synth.ray import RayConfig

    config: SynthConfig | RayConfig | AsyncConfig
    if ray and async_:
        raise typer.BadParameter("--ray and --async are two different captures: give one")
    if memory and (ray or async_):
        raise typer.BadParameter("--memory is an option of the GRPO run (not --ray or --async)")
    if untraced_rollout and not async_:
        raise typer.BadParameter("--untraced-rollout is an option of --async")
    if async_:
        if gpus + rollout_gpus > 8:
            raise typer.BadParameter("--gpus + --rollout-gpus: at most 8 GPUs on the host")
        config = AsyncConfig(
            steps=steps,
            trainer_gpus=gpus,
            rollout_gpus=rollout_gpus,
            kernels_per_phase=kernels,
            seed=seed,
            power=power,
            untraced_rollout=untraced_rollout,
        )
    elif ray:
        config = RayConfig(steps=steps, gpus=gpus, seed=seed, power=power)
        if cuda_graphs is not None:  # else the capture's default (on)
            config = dataclasses.replace(config, graphs=cuda_graphs)
    else:
        config = SynthConfig(
            steps=steps,
            ranks=ranks,
            kernels_per_phase=kernels,
            seed=seed,
            split_files=split,
            reward_model=reward_model,
            power=power,
            lengths=lengths,
            graphs=bool(cuda_graphs),
            memory=memory,
        )
    for path in synthesize(out, config, truth=truth):
        console.print(f"wrote {path}")
