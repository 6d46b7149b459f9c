"""The VeRL hooks against the real `verl` package (0.9.1), imported on the CPU."""

import asyncio
import importlib
import os
import warnings

import polars as pl
import pytest

from nvtx_phases.marking import record_to

if os.environ.get("NVTX_PHASES_REQUIRE_VERL") == "1":
    import verl  # noqa: F401 - in CI the hooks must be tested, never skipped
else:
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")

from nvtx_phases import verl as hooks


def _target(hook):
    owner = importlib.import_module(hook.module)
    *parents, name = hook.qualname.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, name


@pytest.fixture
def installed():
    originals = {}
    for hook in (hooks.TRAINER_TIMER, *hooks.HOOKS):
        if hook.optional:
            continue
        owner, name = _target(hook)
        originals[hook.target] = getattr(owner, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0.9.1 is the tested version: no version warning
        wrapped = hooks.install()
    yield wrapped, originals
    hooks.uninstall()


def test_every_hook_target_exists_and_is_wrapped(installed):
    wrapped, originals = installed
    required = [h for h in (hooks.TRAINER_TIMER, *hooks.HOOKS) if not h.optional]
    assert sorted(h.target for h in required) == [t for t in wrapped if t in originals]
    for hook in required:
        owner, name = _target(hook)
        current = getattr(owner, name)
        assert getattr(current, hooks.WRAPPED_MARK) == hook.target
        assert hooks.original_of(current) is originals[hook.target], hook.target
    # VeRL's Ray dispatch tags (set by @register) survive the wrapping
    from verl.workers.engine_workers import ActorRolloutRefWorker

    original = originals["verl.workers.engine_workers.ActorRolloutRefWorker.update_actor"]
    tags = {k: v for k, v in vars(original).items() if k.startswith("attrs")}
    assert tags and all(
        getattr(ActorRolloutRefWorker.update_actor, k) == v for k, v in tags.items()
    )
    # optional targets whose backend (vLLM) is absent are reported as skipped, not wrapped
    report = hooks.installed()
    assert all(
        report[h.target].startswith("skipped") or h.target in wrapped
        for h in hooks.HOOKS
        if h.optional
    )


def test_trainer_phases_carry_global_steps_and_keep_verl_timing(installed, tmp_path):
    from verl.trainer.ppo import ray_trainer

    class Trainer:  # VeRL's fit() reads self.global_steps; the hook reads the caller's self
        global_steps = 12

        def fit(self):
            timing = {}
            with ray_trainer.marked_timer("step", timing):
                with ray_trainer.marked_timer("gen", timing, color="red"):
                    pass
                with ray_trainer.marked_timer("ref", timing, color="olive"):
                    pass
            return timing

    out = tmp_path / "r.jsonl"
    with record_to(out):
        timing = Trainer().fit()
    assert set(timing) == {"step", "gen", "ref"} and all(v >= 0 for v in timing.values())
    records = pl.read_ndjson(out).select("path", "step").sort("path")
    assert records.rows() == [("step", 12), ("step/gen", 12), ("step/ref", 12)]


def test_worker_methods_emit_their_ranges(installed, tmp_path):
    import torch
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.replica import RolloutReplica

    out = tmp_path / "r.jsonl"
    with record_to(out):
        # real VeRL code runs inside the range; with a bare object it fails, and the range closes
        with pytest.raises(AttributeError):
            ActorRolloutRefWorker.compute_log_prob(object(), None)
        with pytest.raises(AttributeError):
            asyncio.run(RolloutReplica.wake_up(object()))
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
    names = pl.read_ndjson(out)["name"].to_list()
    assert names == ["compute_log_prob", "kv_cache_wake", "backward"]


def test_uninstall_restores_the_originals(installed):
    _, originals = installed
    hooks.uninstall()
    for hook in (hooks.TRAINER_TIMER, *hooks.HOOKS):
        if hook.target in originals:
            owner, name = _target(hook)
            assert getattr(owner, name) is originals[hook.target], hook.target
    assert hooks.installed() == {
        t: v for t, v in hooks.installed().items() if v.startswith("skipped")
    }


def test_a_moved_method_fails_loudly_naming_it(monkeypatch):
    from verl.workers.engine_workers import ActorRolloutRefWorker

    monkeypatch.delattr(ActorRolloutRefWorker, "compute_ref_log_prob")
    with pytest.raises(
        hooks.HookError,
        match=r"ActorRolloutRefWorker\.compute_ref_log_prob not found in verl 0\.9\.1",
    ):
        hooks.install()
    hooks.uninstall()
    with pytest.warns(UserWarning, match="compute_ref_log_prob not found"):
        hooks.install(strict=False)
    hooks.uninstall()


def test_untested_version_warns(monkeypatch):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.warns(UserWarning, match="tested with verl 0.9.1, not 0.10.0"):
        hooks.install()
    hooks.uninstall()


def test_ray_worker_setup_hook_one_liner_installs_hooks_in_workers():
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": "nvtx_phases.verl.install"},
    )
    try:

        @ray.remote
        def wrapped_in_worker():
            from verl.trainer.ppo import ray_trainer
            from verl.workers.engine_workers import ActorRolloutRefWorker

            return (
                hasattr(ray_trainer.marked_timer, hooks.WRAPPED_MARK),
                hasattr(ActorRolloutRefWorker.update_actor, hooks.WRAPPED_MARK),
            )

        assert ray.get(wrapped_in_worker.remote(), timeout=120) == (True, True)
    finally:
        ray.shutdown()


def test_length_recorder_reads_a_real_verl_batch(tmp_path):
    import json

    import numpy as np
    import torch
    from nvtx_phases.analysis.workload.lengths import read_packed_lengths
    from verl.protocol import DataProto

    from nvtx_phases.lengths_record import record_lengths

    # prompts left-padded to 4, responses right-padded to 5; two prompts × two samples
    attention = torch.tensor(
        [
            [0, 1, 1, 1, 1, 1, 0, 0, 0],
            [0, 1, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 0, 0],
        ]
    )
    batch = DataProto.from_dict(
        tensors={
            "prompts": torch.zeros(4, 4, dtype=torch.long),
            "responses": torch.zeros(4, 5, dtype=torch.long),
            "attention_mask": attention,
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    path = record_lengths(batch, 3, tmp_path, dp_size=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    common = {"step": 3, "tp_rank": 0, "local_index": 0, "n_sampling": 2, "validate": False}
    assert rows == [
        {**common, "rank": 0, "dp_rank": 0, "input": 3, "output": [2, 5]},
        {**common, "rank": 1, "dp_rank": 1, "input": 4, "output": [1, 3]},
    ]
    assert read_packed_lengths([tmp_path])["output_len"].to_list() == [2, 5, 1, 3]


def test_length_recorder_installs_over_the_phase_hook_and_uninstalls(tmp_path):
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    original = AgentLoopManager.generate_sequences
    hooks.install(record_lengths_to=str(tmp_path))
    try:
        recorder = AgentLoopManager.generate_sequences
        phase_wrapper = hooks.original_of(recorder)
        assert hooks.original_of(phase_wrapper) is original
        assert hooks.installed()[hooks.LENGTHS_HOOK.target + "#lengths"] == "<length recorder>"
    finally:
        hooks.uninstall()
    assert AgentLoopManager.generate_sequences is original


def test_reward_phase_writes_reward_timings_when_recording(tmp_path):
    import json

    from nvtx_phases.analysis.workload.lengths import read_reward_timings
    from verl.trainer.ppo import ray_trainer

    row = {
        "step": 12,
        "rank": 0,
        "dp_rank": 0,
        "tp_rank": 0,
        "local_index": 0,
        "input": 5,
        "output": [7, 9],
        "n_sampling": 2,
        "validate": False,
    }
    (tmp_path / "packed_lengths_step_12.jsonl").write_text(json.dumps(row) + "\n")
    hooks.install(record_lengths_to=str(tmp_path))
    try:

        class Trainer:
            global_steps = 12

            def fit(self):
                timing = {}
                with (
                    ray_trainer.marked_timer("step", timing),
                    ray_trainer.marked_timer("reward", timing),
                ):
                    pass
                return timing

        Trainer().fit()
    finally:
        hooks.uninstall()
    rewards = read_reward_timings([tmp_path])
    assert rewards.select("step", "rank", "response_sum", "response_max").rows() == [(12, 0, 16, 9)]
    assert rewards["reward_time_s"][0] >= 0


def test_installed_workers_still_pickle_for_ray(installed):
    # Ray pickles VeRL's colocated worker class by value, copying each method's __dict__ into
    # its tracing wrapper: a wrapper that carried the original function itself made Ray pickle
    # ActorRolloutRefWorker.update_weights by value, and fail on torch.distributed.config.
    import ray
    from ray import cloudpickle
    from verl.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_cls
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker = RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker), config=None, role="actor")
    colocated = create_colocated_worker_cls({"actor_rollout": worker})
    assert cloudpickle.dumps(colocated.cls.__ray_actor_class__)
