"""Run VeRL 0.9.1's own GRPO trainer on CPU under nsys, driver and Ray workers in one trace.

``python -m checks.verl_run.run --assets DIR --out DIR`` (what ``make profile-verl`` calls, with
the ``.venv-verl`` interpreter) launches ``python -m verl.trainer.main_ppo`` under
``nsys profile --trace=nvtx``. Ray is started in-process by VeRL's driver, so its raylet and every
worker (the TaskRunner that runs ``RayPPOTrainer.fit``, the FSDP actor/ref worker, the vLLM
server, the agent-loop and reward workers) are descendants of the profiled process: nsys 2022.4
follows them and writes one report holding every process. ``nvtx_phases.verl.install`` is Ray's
``worker_process_setup_hook``, so every worker marks its phases. VeRL's console output (its
``step:N - timing_s/…`` lines) is kept in ``verl_console.log`` for ``nvtx-phases fidelity``.

``--mode fully_async`` runs VeRL's ``fully_async_policy`` instead (trainer and rollouter on
separate pools, through :mod:`nvtx_phases.verl_launch`). ``--mode one_step_off`` runs, but is
not offered by ``make``: its background generation task's ranges interleave with the step's on
the trainer's event-loop thread, which ``analyze`` nests by time (one hierarchy per thread), so
``reward``/``ref``/``adv`` of a step land under ``generate_async`` and fidelity cannot pair them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PLATFORM_MODULE = "checks.verl_run.cpu_platform"
CHECKPOINT_ENGINE_MODULE = "checks.verl_run.cpu_checkpoint_engine"
REPORT_NAME = "verl_grpo"
CONSOLE_LOG = "verl_console.log"
#: ``--mode``: which of VeRL's trainers runs (``make profile-verl VERL_MODE=…``).
MODES = {
    "sync": "verl.trainer.main_ppo",
    "fully_async": "verl.experimental.fully_async_policy.fully_async_main",
    "one_step_off": "verl.experimental.one_step_off_policy.main_ppo",
}
#: Runs a disaggregated trainer's entry point with the hooks in its driver too.
DRIVER_LAUNCHER = "nvtx_phases.verl_launch"
#: The report's name per mode (the synchronous run's name is kept).
REPORT_NAMES = {
    "sync": REPORT_NAME,
    "fully_async": "verl_async",
    "one_step_off": "verl_one_step_off",
}
#: Prompts per trainer step of the disaggregated runs (``ppo_mini_batch_size`` × ``require_batches``).
ASYNC_PROMPTS_PER_STEP = 2


def verl_overrides(assets: Path, *, steps: int, out: Path) -> list[str]:
    """Hydra overrides of ``verl.trainer.main_ppo`` for a tiny GRPO run on one logical GPU."""
    model, data = assets / "model", assets / "data"
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "data.filter_overlong_prompts=False",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.strategy=fsdp2",
        f"{actor}.ppo_mini_batch_size=4",
        f"{actor}.ppo_micro_batch_size_per_gpu=4",
        f"{actor}.use_kl_loss=True",
        f"{actor}.kl_loss_coef=0.001",
        f"{actor}.entropy_coeff=0",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{actor}.fsdp_config.model_dtype=fp32",
        f"{actor}.use_torch_compile=False",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.use_torch_compile=False",
        f"{rollout}.name=vllm",
        f"{rollout}.n=2",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.enforce_eager=True",
        f"{rollout}.free_cache_engine=False",
        f"++{rollout}.enable_sleep_mode=False",
        f"{rollout}.dtype=float32",
        f"{rollout}.gpu_memory_utilization=0.5",
        f"{rollout}.max_num_seqs=16",
        f"{rollout}.max_num_batched_tokens=1024",
        f"{rollout}.max_model_len=128",
        f"{rollout}.load_format=auto",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=4",
        f"{rollout}.agent.num_workers=1",
        "reward.num_workers=1",
        "trainer.critic_warmup=0",
        "trainer.logger=[console]",
        "trainer.project_name=nvtx_phases",
        "trainer.experiment_name=verl_cpu_grpo",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.use_v1=False",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=nvtx_phases.verl.install",
    ]


def _replace(overrides: list[str], changes: dict[str, str]) -> list[str]:
    """``overrides`` with the values of the keys in ``changes`` replaced (others appended)."""
    out, seen = [], set()
    for item in overrides:
        key = item.split("=", 1)[0]
        bare = key.lstrip("+")
        if bare in changes:
            out.append(f"{key}={changes[bare]}")
            seen.add(bare)
        else:
            out.append(item)
    return out + [f"{k}={v}" for k, v in changes.items() if k not in seen]


def validation_frequency(cycles: int) -> int:
    """``trainer.test_freq`` of a fully async run of ``cycles`` parameter syncs.

    VeRL's fully async trainer logs a sync cycle's metrics at the next sync and flushes the last
    cycle after its loop only when the last version is not a multiple of ``test_freq``
    (``fully_async_trainer.py``, ``fit``); it validates at the versions that are. From 3 cycles
    on, one validation at version ``cycles - 1`` keeps the flush; below, no validation.
    """
    return cycles - 1 if cycles >= 3 else 1000


def disaggregated_overrides(
    assets: Path,
    *,
    steps: int,
    out: Path,
    mode: str = "fully_async",
    staleness_threshold: float = 0.5,
    trigger_parameter_sync_step: int = 2,
) -> list[str]:
    """Overrides of the fully async (or one-step-off) trainer: trainer and rollout pools apart.

    One logical GPU each (Ray ``num_gpus=2``); ``steps`` trainer steps (rounded up to whole
    sync cycles of ``trigger_parameter_sync_step`` steps) of :data:`ASYNC_PROMPTS_PER_STEP`
    prompts each; weights synced by the ``gloo`` checkpoint engine
    (:mod:`checks.verl_run.cpu_checkpoint_engine`); validation as :func:`validation_frequency`
    says, on 2 prompts; the rest as the synchronous run.
    """
    rollout, ckpt = "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.checkpoint_engine"
    trigger = trigger_parameter_sync_step if mode == "fully_async" else 1
    cycles = -(-steps // trigger)
    changes = {
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(ASYNC_PROMPTS_PER_STEP),
        "trainer.n_gpus_per_node": "1",
        "trainer.test_freq": str(validation_frequency(cycles) if mode == "fully_async" else -1),
        "data.val_max_samples": "2",
        "ray_kwargs.ray_init.num_gpus": "2",
        "ray_kwargs.ray_init.num_cpus": "32",
        "actor_rollout_ref.hybrid_engine": "False",
        f"{rollout}.mode": "async",
        f"{rollout}.calculate_log_probs": "True",
        f"{ckpt}.backend": "gloo",
        f"{ckpt}.custom_backend_module": CHECKPOINT_ENGINE_MODULE,
        f"{ckpt}.update_weights_bucket_megabytes": "64",
        "rollout.nnodes": "1",
        "rollout.n_gpus_per_node": "1",
    }
    if mode == "fully_async":
        changes |= {
            "data.train_batch_size": "0",
            "data.gen_batch_size": "1",
            "rollout.total_rollout_steps": str(cycles * trigger * ASYNC_PROMPTS_PER_STEP),
            "async_training.staleness_threshold": str(staleness_threshold),
            "async_training.trigger_parameter_sync_step": str(trigger),
            "async_training.require_batches": "1",
            "async_training.partial_rollout": "True",
        }
    elif mode == "one_step_off":
        changes |= {
            "data.train_batch_size": str(ASYNC_PROMPTS_PER_STEP),
            # its config finds the base config at file://verl/trainer/config (VeRL's repo root)
            "hydra.searchpath": "[pkg://verl.trainer.config]",
        }
    else:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    base = verl_overrides(assets, steps=steps, out=out)
    if mode == "fully_async":  # the rollouter counts prompts; the trainer has no step limit
        base = [o for o in base if not o.startswith("trainer.total_training_steps=")]
    merged = _replace(base, {k.lstrip("+"): v for k, v in changes.items()})
    plus = {k.lstrip("+") for k in changes if k.startswith("+")}
    return [f"+{o}" if o.split("=", 1)[0] in plus else o for o in merged]


def overrides_for(mode: str, assets: Path, *, steps: int, out: Path) -> list[str]:
    """The Hydra overrides of ``mode`` (:data:`MODES`)."""
    if mode == "sync":
        return verl_overrides(assets, steps=steps, out=out)
    return disaggregated_overrides(assets, steps=steps, out=out, mode=mode)


def verl_environment(repo: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the run: the CPU platform, vLLM's CPU build, the project importable."""
    env = dict(os.environ if base is None else base)
    python_path = [str(repo), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(python_path),
            "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,
            "VERL_PLATFORM": "cpu",
            "VERL_ENGINE_DEVICE": "cuda",
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # vLLM gives up on a model step after 300 s; a loaded 2-core machine can exceed it in
            # the first generation (seen: TimeoutError "RPC call to execute_model timed out")
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": env.get(
                "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600"
            ),
            "RAY_DEDUP_LOGS": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def nsys_command(nsys: str, report: Path, command: list[str]) -> list[str]:
    """``nsys profile`` of ``command`` and its whole process tree: NVTX only (no GPU here).

    CPU sampling and context-switch tracing are off: with them nsys 2022.4 often hangs after the
    workload exits (``../shared/nsys/README.md``).
    """
    return [
        nsys,
        "profile",
        "--trace=nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--wait=primary",
        "--export=sqlite",
        "--force-overwrite=true",
        "-o",
        str(report),
        *command,
    ]


def run(
    assets: Path,
    out: Path,
    *,
    steps: int,
    nsys: str,
    timeout_s: float,
    mode: str = "sync",
) -> int:
    """Profile the run; VeRL's console output goes to ``out/verl_console.log`` (and stdout).

    ``nsys=""`` runs VeRL without nsys (a dry run of the set-up).
    """
    repo = Path(__file__).resolve().parents[2]
    out.mkdir(parents=True, exist_ok=True)
    verl = [sys.executable, "-m", MODES[mode]]
    if mode != "sync":  # the controllers' actor classes travel from the driver (verl_launch)
        verl = [sys.executable, "-m", DRIVER_LAUNCHER, MODES[mode]]
    command = verl + overrides_for(mode, assets, steps=steps, out=out)
    if nsys:
        command = nsys_command(nsys, out / REPORT_NAMES[mode], command)
    print("+ " + " ".join(command), flush=True)
    started = time.monotonic()
    with (out / CONSOLE_LOG).open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command,
            env=verl_environment(repo),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
            if time.monotonic() - started > timeout_s:
                os.killpg(process.pid, 9)
                raise SystemExit(f"the VeRL run took more than {timeout_s:.0f} s: killed")
        code = process.wait()
    print(f"VeRL under nsys: exit status {code} after {time.monotonic() - started:.0f} s")
    return code


def main(argv: list[str] | None = None) -> None:
    """Command line of the run (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", type=Path, default=Path("verl_run_assets"))
    parser.add_argument("--out", type=Path, default=Path("out/verl"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--mode", choices=sorted(MODES), default="sync")
    parser.add_argument("--nsys", default=os.environ.get("NSYS") or shutil.which("nsys") or "")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--no-nsys", action="store_true", help="run VeRL without nsys")
    args = parser.parse_args(argv)
    if args.no_nsys:
        args.nsys = ""
    elif not args.nsys:
        raise SystemExit("nsys not found: put it on PATH or set NSYS=/path/to/nsys")
    if not (args.assets / "assets.json").exists():
        from checks.verl_run.build_assets import build

        build(args.assets)
    code = run(
        args.assets.resolve(),
        args.out.resolve(),
        steps=args.steps,
        nsys=args.nsys,
        timeout_s=args.timeout,
        mode=args.mode,
    )
    if code != 0:
        raise SystemExit(f"VeRL run failed (exit status {code}); see {args.out / CONSOLE_LOG}")


if __name__ == "__main__":
    main()
