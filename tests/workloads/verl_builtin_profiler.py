"""A VeRL 0.9.1 training loop in miniature, marked only by VeRL's own nsys profiler code.

No nvtx_phases hook is installed. The driver (this process) opens its phases with the trainer's
timer, ``verl.utils.debug.marked_timer`` (what ``RayPPOTrainer.fit`` uses; with ``nvtx``
installed it opens an NVTX range per phase), in ``fit``'s order, around a worker process that
plays a colocated Ray worker: it runs the real ``ActorRolloutRefWorker.compute_log_prob``,
``compute_ref_log_prob``, ``update_actor`` and, for the critic, the real
``TrainingWorker.train_mini_batch``/``train_batch`` under real ``DistProfiler`` objects
configured for nsys, started and stopped with the real ``start_profile``/``stop_profile``. So the
worker's ranges are the stage labels VeRL's ``DistProfiler.annotate`` gives them
(``actor_compute_log_prob``, …), exactly as in a real run. What is simulated: the model work
(engines that sleep) and Ray (a pipe to the worker process).

One stub: ``cudaProfilerStart``/``Stop`` (VeRL's ``NsightSystemsProfiler.start``/``stop`` call
them to open nsys's capture range) need CUDA; this capture has no capture range, so they are
no-ops here.

``python verl_builtin_profiler.py`` runs the driver; ``--worker`` the worker.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

STEPS = 3
#: Mini-batches per actor or critic update (the critic's are ``train_batch`` ranges).
MINI_BATCHES = 2
#: Driver phases in ``RayPPOTrainer.fit`` order, and what each does here: sleep (seconds) on the
#: driver, or a call to the worker.
DRIVER_PLAN: tuple[tuple[str, float | str], ...] = (
    ("gen", 0.030),
    ("reward", 0.010),
    ("old_log_prob", "compute_log_prob"),
    ("ref", "compute_ref_log_prob"),
    ("values", 0.005),
    ("adv", 0.005),
    ("update_critic", "update_critic"),
    ("update_actor", "update_actor"),
    ("update_weights", 0.005),
    ("dump_rollout_generations", 0.002),
)
#: The model work inside each worker call (seconds of sleep).
WORK_S = 0.015
#: Range names the worker's calls open (VeRL's stage labels), per call.
WORKER_RANGES = {
    "compute_log_prob": "actor_compute_log_prob",
    "compute_ref_log_prob": "ref_compute_log_prob",
    "update_critic": "train_batch",
    "update_actor": "actor_update",
}
READY = "READY"
DONE = "DONE"


def _no_cuda_profiler_api() -> None:
    """Make VeRL's ``cudaProfilerStart``/``Stop`` calls no-ops (no CUDA here; see module doc)."""
    from verl.plugin.platform import get_platform

    platform = get_platform()
    platform.profiler_start = lambda: None
    platform.profiler_stop = lambda: None


class _SleepingEngine:
    """The engine calls ``TrainingWorker`` makes, with sleeps for model work."""

    @contextlib.contextmanager
    def train_mode(self, **_: Any):
        yield

    def train_batch(self, data: Any, loss_function: Any) -> dict:
        time.sleep(WORK_S)
        return {"metrics": {}, "model_output": None}

    def lr_scheduler_step(self) -> float:
        return 0.0

    def is_mp_src_rank_with_outputs(self) -> bool:
        return False

    def get_data_parallel_size(self) -> int:
        return 1

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_group(self) -> None:
        return None


def _worker() -> None:
    _no_cuda_profiler_api()
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.profiler import DistProfiler, ProfilerConfig
    from verl.utils.profiler.config import NsightToolConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    def profiler() -> DistProfiler:
        config = ProfilerConfig(tool="nsys", enable=True, all_ranks=True)
        return DistProfiler(rank=0, config=config, tool_config=NsightToolConfig(discrete=False))

    class Training:
        """A ``TrainingWorker`` whose real ``train_mini_batch``/``train_batch`` drive the engine."""

        train_mini_batch = TrainingWorker.train_mini_batch
        train_batch = TrainingWorker.train_batch
        start_profile = TrainingWorker.start_profile
        stop_profile = TrainingWorker.stop_profile

        def __init__(self) -> None:
            self.profiler = profiler()
            self.engine = _SleepingEngine()
            self.loss_fn = object()
            self.model_config: dict = {}
            self.engine_config = SimpleNamespace(
                forward_only=False,
                use_dynamic_bsz=False,
                max_token_len_per_gpu=None,
                micro_batch_size_per_gpu=1,
                use_fused_kernels=False,
            )

        def infer_batch(self, data: TensorDict) -> TensorDict:  # not annotated in 0.9.1 either
            time.sleep(WORK_S)
            return data

    # VeRL's inner actor/ref TrainingWorkers get their own DistProfiler, never started by the
    # trainer (it starts the outer worker's): their train_batch opens no range, as in VeRL.
    actor_rollout_ref = SimpleNamespace(
        profiler=profiler(), actor=Training(), ref=Training(), enable_routing_replay=False
    )
    critic = Training()

    def batch() -> TensorDict:
        data = TensorDict({"x": torch.zeros(MINI_BATCHES, 1)}, batch_size=[MINI_BATCHES])
        tu.assign_non_tensor(data, num_mini_batch=MINI_BATCHES)
        return data

    calls = {
        "start_profile": lambda: (
            ActorRolloutRefWorker.start_profile(actor_rollout_ref, role="train"),
            critic.start_profile(),
        ),
        "stop_profile": lambda: (
            ActorRolloutRefWorker.stop_profile(actor_rollout_ref, run_command=False),
            critic.stop_profile(run_command=False),
        ),
        "compute_log_prob": lambda: ActorRolloutRefWorker.compute_log_prob(
            actor_rollout_ref, batch()
        ),
        "compute_ref_log_prob": lambda: ActorRolloutRefWorker.compute_ref_log_prob(
            actor_rollout_ref, batch()
        ),
        "update_actor": lambda: ActorRolloutRefWorker.update_actor(actor_rollout_ref, batch()),
        "update_critic": lambda: critic.train_mini_batch(batch()),
    }
    print(READY, flush=True)
    for line in sys.stdin:
        calls[line.strip()]()
        print(DONE, flush=True)


def _driver() -> None:
    from verl.utils.debug import marked_timer  # what verl.trainer.ppo.ray_trainer imports

    worker = subprocess.Popen(
        [sys.executable, __file__, "--worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdin is not None and worker.stdout is not None

    def wait_for(word: str) -> None:
        for line in worker.stdout:  # VeRL's profiler prints its own lines too: skip them
            if line.strip() == word:
                return
        raise RuntimeError(f"worker exited before {word}")

    def call(name: str) -> None:
        worker.stdin.write(name + "\n")
        worker.stdin.flush()
        wait_for(DONE)

    wait_for(READY)
    for _ in range(STEPS):
        timing: dict[str, float] = {}
        with marked_timer("start_profile", timing):
            call("start_profile")
        with marked_timer("step", timing):
            for name, action in DRIVER_PLAN:
                with marked_timer(name, timing):
                    if isinstance(action, str):
                        call(action)
                    else:
                        time.sleep(action)
        with marked_timer("stop_profile", timing):
            call("stop_profile")
    worker.stdin.close()
    if worker.wait(timeout=60) != 0:
        raise SystemExit(f"worker failed with exit status {worker.returncode}")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker()
    else:
        _driver()
