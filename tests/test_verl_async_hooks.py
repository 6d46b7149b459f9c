"""The hooks of VeRL 0.9.1's disaggregated trainers against the real `verl` package, on the CPU."""

import asyncio
import os
import time
import types

import numpy as np
import polars as pl
import pytest

from nvtx_phases.marking import record_to

if os.environ.get("NVTX_PHASES_REQUIRE_VERL") == "1":
    import verl  # noqa: F401 - in CI the hooks must be tested, never skipped
else:
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")

from nvtx_phases import pools, verl_async
from nvtx_phases import verl as hooks

FA = "verl.experimental.fully_async_policy"


@pytest.fixture
def marks(monkeypatch):
    """Every NVTX mark message emitted (pool and samples marks), in order."""
    sent: list[tuple[str, str]] = []
    fake = types.SimpleNamespace(mark=lambda text, domain: sent.append((text, domain)))
    monkeypatch.setattr(pools, "nvtx", fake)
    monkeypatch.setattr(verl_async, "_marked_roles", set())
    return sent


@pytest.fixture
def installed():
    hooks.install()
    yield
    hooks.uninstall()


def _records(path):
    return pl.read_ndjson(path).sort("start_mono_ns") if path.exists() else pl.DataFrame()


def test_every_async_target_resolves_and_is_wrapped(installed):
    report = hooks.installed()
    for hook in (*hooks.ASYNC_TIMERS, *(h for h, _ in hooks.ASYNC_HOOKS)):
        if hook.optional and report.get(hook.target, "").startswith("skipped"):
            continue  # vLLM absent from this environment
        _owner, _name, current = hooks._resolve(hook)
        assert getattr(current, hooks.WRAPPED_MARK) == hook.target, hook.target
    # the Ray actor classes: the class Ray runs (and pickles by value) carries the wrappers
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter
    from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer

    for actor, method in (
        (FullyAsyncRollouter, "reset_staleness"),
        (FullyAsyncTrainer, "__init__"),
    ):
        runs = actor.__ray_metadata__.modified_class
        assert hasattr(getattr(runs, method), hooks.WRAPPED_MARK)


LOAD_ACTOR_CLASS = """
import inspect, json, sys
from ray import cloudpickle
runs = cloudpickle.loads(open(sys.argv[1], "rb").read())  # no hooks installed in this process
timer = inspect.unwrap(runs.fit_step).__globals__["marked_timer"]
print(json.dumps([getattr(runs.__init__, "__nvtx_phases_original__", None),
                  getattr(timer, "__nvtx_phases_original__", None)]))
"""


def test_actor_classes_pickled_by_value_keep_the_hooks(installed, tmp_path):
    # Ray exports the class a module-level @ray.remote made by value, from the process that
    # creates the actor (VeRL's task runner, hooked by the setup hook): the actor's process
    # runs the wrapped methods and timers it carries, not its own module's.
    import json
    import subprocess
    import sys

    from ray import cloudpickle
    from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer

    path = tmp_path / "actor_class.pkl"
    path.write_bytes(cloudpickle.dumps(FullyAsyncTrainer.__ray_metadata__.modified_class))
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ACTOR_CLASS, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        f"{FA}.fully_async_trainer.FullyAsyncTrainer.__init__",
        f"{FA}.fully_async_trainer.marked_timer",
    ]


def test_async_trainer_timers_carry_global_steps_and_rename(installed, tmp_path):
    from verl.experimental.fully_async_policy import fully_async_trainer
    from verl.experimental.separation import ray_trainer

    class Trainer:  # the timers read the caller's self.global_steps, as the sync hook does
        global_steps = 7

        async def fit_step(self):
            timing = {}
            with fully_async_trainer.marked_timer("step", timing):
                with fully_async_trainer.marked_timer("gen", timing):
                    await asyncio.sleep(0)
                with ray_trainer.marked_timer("update_actor", timing):
                    pass
                with fully_async_trainer.marked_timer("timing_s/param_sync", timing):
                    await asyncio.sleep(0)
            return timing

    out = tmp_path / "r.jsonl"
    with record_to(out):
        timing = asyncio.run(Trainer().fit_step())
    # VeRL's own timing keys are kept as VeRL names them
    assert set(timing) == {"step", "gen", "update_actor", "timing_s/param_sync"}
    rows = _records(out).select("path", "step").sort("path").rows()
    assert rows == [
        ("step", 7),
        ("step/gen", 7),
        ("step/param_sync", 7),
        ("step/update_actor", 7),
    ]


def test_samples_mark_per_trainer_step(installed, marks):
    from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer

    runs = FullyAsyncTrainer.__ray_metadata__.modified_class
    trainer = types.SimpleNamespace(
        global_steps=7, current_param_version=3, stale_trajectory_processed=0
    )
    batch = types.SimpleNamespace(
        meta_info={"trajectory_param_versions": np.array([2, 3, 2, 3, 3], dtype=object)}
    )
    metrics: dict = {}
    runs._collect_metrics_from_samples(trainer, batch, metrics)
    # VeRL's own metric is computed as before: trajectories one version or more behind
    assert metrics["fully_async/count/stale_trajectory_processed"] == 2
    assert marks == [("nvtx_phases.samples step=7 version=3 versions=2:2,3:3", "nvtx_phases")]


class _Queue:
    async def get_queue_size(self):
        return 0


def _rollouter():
    """A FullyAsyncRollouter with just the state its pause/resume/reset methods touch."""
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter

    cls = FullyAsyncRollouter.__ray_metadata__.modified_class
    rollouter = cls.__new__(cls)
    verl_async.after_rollouter_init(rollouter)
    rollouter.__dict__.update(
        paused=False,
        running=True,
        active_tasks=set(),
        message_queue_client=_Queue(),
        step_start_time=0.0,
        idle_start_time=0.0,
        _step_generated_samples=0,
        _completed_steps=1,
        _STEP_HISTORY_SIZE=10,
        _step_samples_history=[],
        max_concurrent_samples=4,
        _active_count_history=[(0.0, 0, 4)],
        _validate=lambda: {"val-core/acc": 1.0},
    )
    return cls, rollouter


def test_rollouter_version_gen_staleness_wait_and_validate(installed, marks, tmp_path):
    cls, rollouter = _rollouter()
    assert marks == [("nvtx_phases.pool role=rollout", "nvtx_phases")]
    timings = []

    async def scenario():
        cls._init_async_objects(rollouter)  # VeRL's lock and pause event (wrapped: marked)
        await cls.reset_staleness(rollouter)  # the sync before training: version 0 begins

        async def streaming(self):  # stands for VeRL's _processor_worker: generate, pause…
            await asyncio.sleep(0.05)  # generating
            async with self.lock:
                self.paused = True
                self._resume_event.clear()  # the staleness limit reached: drain begins
            await asyncio.sleep(0.05)  # in-flight samples finish: still generating
            self.idle_start_time = time.time()  # drained: VeRL's idle from here
            await asyncio.sleep(0.05)
            timings.append(await cls.reset_staleness(self))  # the trainer synced version 1
            await asyncio.sleep(0.02)
            timing = cls.do_validate(self)
            assert "rollouter/validate_time" in timing  # VeRL's key, kept
            timings.append(await cls.reset_staleness(self))  # version 2, never idle in 1

        await verl_async.wrap_streaming_main(streaming)(rollouter)
        await cls.reset_staleness(rollouter)  # generation over: no version 3
        await verl_async.wrap_rollouter_fit(lambda self: asyncio.sleep(0))(rollouter)

    out = tmp_path / "r.jsonl"
    with record_to(out):
        asyncio.run(scenario())
    rows = _records(out)
    # in start order (a JSON-lines path names the ranges its own block opened: validate's
    # enclosing version and gen are spans, so it reads "validate"; nsys nests it by time)
    assert rows.select("path", "step").rows() == [
        ("version", 0),  # from the sync before training
        ("version/gen", 0),  # generation starts; the drain after the pause signal is gen too
        ("version/staleness_wait", 0),  # drained (VeRL's idle_start_time): waiting
        ("version", 1),  # reset_staleness resumed generation with it
        ("version/gen", 1),
        ("validate", 1),
        ("version", 2),
        ("version/gen", 2),
    ]
    # VeRL's own timers of versions 0 and 1 against the ranges (clocks apart: within 5 ms)
    by_path = {p: g.sort("start_mono_ns") for (p,), g in rows.group_by("path")}
    version, wait = by_path["version"].row(0, named=True), by_path["version/staleness_wait"]
    active = (wait["start_mono_ns"][0] - version["start_mono_ns"]) / 1e9
    assert timings[0]["fully_async/rollouter/active_time"] == pytest.approx(active, abs=5e-3)
    assert timings[0]["fully_async/rollouter/version_time"] == pytest.approx(
        version["dur_ns"] / 1e9, abs=5e-3
    )
    assert active == pytest.approx(0.1, abs=0.03)  # generating and draining: 2 × 50 ms
    second = by_path["version"].row(1, named=True)["dur_ns"] / 1e9
    assert timings[1]["fully_async/rollouter/idle_ratio"] == 0  # never idle: active = version
    assert timings[1]["fully_async/rollouter/active_time"] == pytest.approx(second, abs=5e-3)
    versions = by_path["version"]
    # the versions tile the rollouter's timeline: each ends where the next begins (or later)
    ends, starts = versions["end_mono_ns"].to_list(), versions["start_mono_ns"].to_list()
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))


def test_rollouter_first_version_is_the_checkpoints(installed):
    _cls, rollouter = _rollouter()
    rollouter.required_samples = 4
    rollouter.config = types.SimpleNamespace(
        async_training=types.SimpleNamespace(trigger_parameter_sync_step=2)
    )
    rollouter.global_steps = 5 * 4 * 2 + 1  # what VeRL's load_checkpoint sets for version 5
    verl_async.after_rollouter_load_checkpoint(rollouter)
    assert verl_async.timeline_of(rollouter).first_version == 5


def _server(mode="standalone", backend="gloo", version=4):
    return types.SimpleNamespace(
        rollout_mode=types.SimpleNamespace(value=mode),
        config=types.SimpleNamespace(checkpoint_engine=types.SimpleNamespace(backend=backend)),
        global_steps=version,
    )


def test_rollout_server_param_sync_and_partial_pause(tmp_path, marks):
    async def abort(self):
        return {"aborted_count": self.in_flight}

    async def gate(self):
        return None

    async def sync(server):
        await verl_async.wrap_server_abort(abort)(server)
        await verl_async.wrap_server_gate(gate)(server)

    busy, idle, colocated = _server(), _server(version=5), _server(mode="hybrid", backend="naive")
    busy.in_flight, idle.in_flight, colocated.in_flight = 3, 0, 3
    out = tmp_path / "r.jsonl"
    with record_to(out):
        for server in (busy, idle, colocated):
            asyncio.run(sync(server))
    assert _records(out).select("path", "step").rows() == [
        ("param_sync", 4),
        ("param_sync/partial_pause", 4),  # in-flight requests were interrupted
        ("param_sync", 5),  # nothing in flight: the refit bubble only
    ]  # a colocated (hybrid) server marks nothing


def test_pool_marks_once_per_process_only_for_disaggregated_processes(marks):
    worker = types.SimpleNamespace(rollout_config=_server().config)
    verl_async.after_server_init(_server(mode="hybrid", backend="naive"))  # colocated: none
    verl_async.after_checkpoint_worker_init(
        types.SimpleNamespace(rollout_config=_server(backend="naive").config)
    )
    assert marks == []
    verl_async.after_checkpoint_worker_init(worker)
    verl_async.after_server_init(_server())  # same process, same role: once
    verl_async.after_detach_worker_init(object())
    assert marks == [
        ("nvtx_phases.pool role=rollout", "nvtx_phases"),  # no GPU on this machine
        ("nvtx_phases.pool role=trainer", "nvtx_phases"),
    ]


def test_colocated_trainer_path_is_unchanged(installed, marks, tmp_path):
    from verl.trainer.ppo import ray_trainer
    from verl.workers.engine_workers import ActorRolloutRefWorker

    # the sync trainer's timer: push/pop ranges (not start/end), no pool marks, no renaming
    assert not hasattr(ActorRolloutRefWorker.__init__, hooks.WRAPPED_MARK)
    assert hooks.original_of(ray_trainer.marked_timer).__module__ != verl_async.__name__

    class Trainer:
        global_steps = 3

        def fit(self):
            timing = {}
            with (
                ray_trainer.marked_timer("step", timing),
                ray_trainer.marked_timer("update_weights", timing),
            ):
                pass
            return timing

    out = tmp_path / "r.jsonl"
    with record_to(out):
        Trainer().fit()
    assert _records(out).select("path", "step").rows() == [("step", 3), ("step/update_weights", 3)]
    assert marks == []


def test_auto_await_methods_stay_awaitable_for_coroutine_callers(tmp_path):
    # VeRL's AgentLoopManager.generate_sequences is @auto_await: one-step-off's trainer awaits
    # it, the colocated trainer calls it; behind the hook both must still work, in one range
    from verl.utils.ray_utils import auto_await

    class Manager:
        @auto_await
        async def generate_sequences(self, x):
            await asyncio.sleep(0)
            return x + 1

    Manager.generate_sequences = hooks.phase_wrapper("generation", Manager.generate_sequences)

    async def awaiting():
        return await Manager().generate_sequences(1)

    out = tmp_path / "r.jsonl"
    with record_to(out):
        assert asyncio.run(awaiting()) == 2  # before: "object int can't be used in 'await'"
        assert Manager().generate_sequences(2) == 3  # a plain caller gets the result
    assert _records(out)["path"].to_list() == ["generation", "generation"]
