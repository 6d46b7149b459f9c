"""Hooks for VeRL 0.9.1's disaggregated trainers: fully async policy and one-step-off policy.

Installed by :func:`nvtx_phases.verl.install` with the colocated trainer's hooks (one Ray
``worker_process_setup_hook``). What VeRL 0.9.1 does, and what is marked where:

- **trainer controller** (``FullyAsyncTrainer`` Ray actor, or the ``OneStepOffRayTrainer`` in its
  task runner): the ``marked_timer`` of ``fully_async_trainer``, ``separation.ray_trainer`` and
  ``one_step_off_policy.ray_trainer`` (``step, gen, reward, old_log_prob, ref, values, adv,
  update_critic, update_actor, timing_s/param_sync, wait_for_enough_samples, testing,
  save_checkpoint, start_profile, stop_profile``; one-step-off: ``sync_rollout_weights``,
  ``update_weights``, ``generate_async``) gives one start/end range per timer, carrying the
  trainer's ``global_steps`` (names with ``/`` renamed by :data:`~nvtx_phases.naming.ASYNC_RENAMES`;
  VeRL's own timing kept under its own key). Start/end, not push/pop: the trainers are
  coroutines on one event-loop thread, and one-step-off's ``generate_async`` runs as a task
  beside the step. Per step, a samples mark (:func:`nvtx_phases.pools.mark_samples`) from
  ``batch.meta_info["trajectory_param_versions"]`` (one entry per trajectory, a response), read
  where VeRL reads it (``_collect_metrics_from_samples``). Pool mark ``role=trainer``.
- **rollouter controller** (``FullyAsyncRollouter`` Ray actor): ``version`` ranges (payload =
  parameter version) with ``gen`` and ``staleness_wait`` inside, driven by VeRL's own events
  (:mod:`nvtx_phases.verl_rollout` says which), and ``validate`` (its
  ``rollouter/validate_time`` timer). Pool mark ``role=rollout``.
- **rollout servers** (``vLLMHttpServer``, standalone): the weight-sync pause VeRL imposes
  (``abort_all_requests`` … ``open_submission_gate``) as ``param_sync`` (payload = the version the
  server generated with), and inside it ``partial_pause`` when the abort interrupted in-flight
  requests (partial rollout). Pool mark ``role=rollout`` with the server's GPUs; also the
  checkpoint-engine workers beside it (``weight_sync`` around their ``update_weights``).
- **trainer workers** (``DetachActorWorker``): pool mark ``role=trainer`` with their GPUs.

Colocated (``main_ppo``) runs use none of these classes: they get no pool marks and the same
ranges as before.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nvtx_phases.hook import Hook
from nvtx_phases.marking import Span, phase
from nvtx_phases.naming import ASYNC_RENAMES
from nvtx_phases.pools import mark_pool, mark_samples
from nvtx_phases.verl_rollout import TIMELINE_ATTR, PauseEvent, RolloutTimeline, timeline_of

#: Attribute holding a rollout server's open weight-sync spans.
SYNC_ATTR = "_nvtx_phases_sync"
FULLY_ASYNC = "verl.experimental.fully_async_policy"
TRAINER, ROLLOUT = "trainer", "rollout"
PARAM_SYNC, PARTIAL_PAUSE = "param_sync", "partial_pause"

_marked_roles: set[str] = set()


def mark_role(role: str, *, gpus: bool = False) -> str | None:
    """Emit this process's pool mark once (the first call per role wins; later ones: None)."""
    if role in _marked_roles:
        return None
    _marked_roles.add(role)
    return mark_pool(role) if gpus else mark_pool(role, [])


def step_of(owner: Any) -> int | None:
    """The step of a timer opened by ``owner``: a rollouter's version, a trainer's global step."""
    timeline = getattr(owner, TIMELINE_ATTR, None)
    if isinstance(timeline, RolloutTimeline):
        return timeline.version
    value = getattr(owner, "global_steps", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def async_timer(timing_only: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in for an async trainer's ``marked_timer``: VeRL's timing plus one start/end range."""

    @contextmanager
    def _both(name: str, step_index: int | None, timer: Any) -> Iterator[None]:
        with phase(name, step=step_index, asynchronous=True), timer:
            yield

    @functools.wraps(timing_only)
    def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        step_index = step_of(caller.f_locals.get("self"))
        label = ASYNC_RENAMES.get(str(name), str(name))
        return _both(label, step_index, timing_only(name, timing_raw, *args, **kwargs))

    return marked_timer


# --- what each wrapper does, as module functions (a wrapper pickled by value with its Ray actor
# class calls them by reference, so they run with this module's state in the actor's process) ---


def after_trainer_init(_trainer: Any) -> None:
    """An async trainer controller exists in this process."""
    mark_role(TRAINER)


def after_rollouter_init(rollouter: Any) -> None:
    """The rollouter controller exists in this process."""
    timeline_of(rollouter)
    mark_role(ROLLOUT)


def after_rollouter_load_checkpoint(rollouter: Any) -> None:
    """The first version: the checkpoint's (VeRL sets ``global_steps = v × samples × trigger + 1``)."""
    config = getattr(rollouter, "config", None)
    try:
        per_version = int(rollouter.required_samples) * int(
            config.async_training.trigger_parameter_sync_step  # type: ignore[union-attr]
        )
        timeline_of(rollouter).first_version = (int(rollouter.global_steps) - 1) // per_version
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        pass  # the first version stays 0


def after_init_async_objects(rollouter: Any) -> None:
    """Replace VeRL's pause event by one that tells the timeline."""
    event = getattr(rollouter, "_resume_event", None)
    if isinstance(event, asyncio.Event) and not isinstance(event, PauseEvent):
        rollouter._resume_event = PauseEvent(timeline_of(rollouter), event.is_set())


def after_collect_samples(trainer: Any, batch: Any) -> None:
    """The samples mark of the trainer's step: its version and its samples' versions."""
    meta = getattr(batch, "meta_info", None) or {}
    versions = meta.get("trajectory_param_versions")
    if versions is None:
        return
    counts: collections.Counter[int] = collections.Counter()
    for value in versions:
        try:
            counts[int(value)] += 1
        except (TypeError, ValueError):
            continue  # a trajectory whose server had no version yet
    step_index, version = step_of(trainer), getattr(trainer, "current_param_version", None)
    if counts and step_index is not None and isinstance(version, int):
        mark_samples(step_index, version, counts)


def is_standalone_rollout(server: Any) -> bool:
    """A disaggregated rollout server: standalone mode, weights from a checkpoint engine."""
    mode = getattr(getattr(server, "rollout_mode", None), "value", None)
    engine = getattr(getattr(server, "config", None), "checkpoint_engine", None)
    return mode == "standalone" and getattr(engine, "backend", "naive") != "naive"


def after_server_init(server: Any) -> None:
    """A standalone rollout server: pool ``rollout`` with the GPUs it was given."""
    if is_standalone_rollout(server):
        mark_role(ROLLOUT, gpus=True)


def after_checkpoint_worker_init(worker: Any) -> None:
    """A rollout-side checkpoint-engine worker of a disaggregated run: pool ``rollout``."""
    engine = getattr(getattr(worker, "rollout_config", None), "checkpoint_engine", None)
    if getattr(engine, "backend", "naive") != "naive":
        mark_role(ROLLOUT, gpus=True)


def after_detach_worker_init(_worker: Any) -> None:
    """A trainer worker of a disaggregated trainer: pool ``trainer`` with its GPUs."""
    mark_role(TRAINER, gpus=True)


def server_pause_started(server: Any) -> None:
    """``abort_all_requests``: the server stops generating for a weight update."""
    if not is_standalone_rollout(server):
        return
    spans = getattr(server, SYNC_ATTR, None)
    if spans:
        return  # already paused (abort called twice before the resume)
    version = getattr(server, "global_steps", None)
    step_index = version if isinstance(version, int) else None
    setattr(server, SYNC_ATTR, [Span(PARAM_SYNC, step=step_index)])


def server_pause_aborted(server: Any, result: Any) -> None:
    """In-flight requests were interrupted (partial rollout): ``partial_pause`` inside it."""
    spans = getattr(server, SYNC_ATTR, None)
    count = result.get("aborted_count", 0) if isinstance(result, dict) else 0
    if spans and len(spans) == 1 and isinstance(count, int) and count > 0:
        spans.append(Span(PARTIAL_PAUSE, step=spans[0].step, parent=spans[0]))


def server_pause_ended(server: Any) -> None:
    """``open_submission_gate``: the server admits requests again."""
    spans = getattr(server, SYNC_ATTR, None) or []
    for span in reversed(spans):
        span.end()
    if spans:
        setattr(server, SYNC_ATTR, [])


# --- the wrappers ---


def call_then(after: Callable[..., None]) -> Callable[[Any], Any]:
    """Wrap a sync method: run it, then ``after(self)``."""

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            after(self)
            return result

        return wrapper

    return wrap


def wrap_collect_samples(original: Any) -> Any:
    """``_collect_metrics_from_samples(batch, metrics)``, then the samples mark."""

    @functools.wraps(original)
    def wrapper(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, batch, *args, **kwargs)
        after_collect_samples(self, batch)
        return result

    return wrapper


def wrap_reset_staleness(original: Any) -> Any:
    """``reset_staleness()``: VeRL resumes generation, then a new version begins."""

    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        timeline = timeline_of(self)
        timeline.in_reset = True
        try:
            result = await original(self, *args, **kwargs)
        finally:
            timeline.in_reset = False
        timeline.version_installed()
        return result

    return wrapper


def wrap_streaming_main(original: Any) -> Any:
    """``_streaming_generation_main()``: generation runs while it does."""

    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        timeline_of(self).generation_started()
        try:
            return await original(self, *args, **kwargs)
        finally:
            timeline_of(self).generation_ended()

    return wrapper


def wrap_rollouter_fit(original: Any) -> Any:
    """``FullyAsyncRollouter.fit()``: its last version ends when it returns."""

    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, *args, **kwargs)
        finally:
            timeline_of(self).rollouter_stopped()

    return wrapper


def wrap_server_abort(original: Any) -> Any:
    """``vLLMHttpServer.abort_all_requests``: the weight-sync pause starts."""

    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        server_pause_started(self)
        result = await original(self, *args, **kwargs)
        server_pause_aborted(self, result)
        return result

    return wrapper


def wrap_server_gate(original: Any) -> Any:
    """``vLLMHttpServer.open_submission_gate``: the weight-sync pause ends."""

    @functools.wraps(original)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await original(self, *args, **kwargs)
        finally:
            server_pause_ended(self)

    return wrapper


# --- the hooks (nvtx_phases.verl installs them) ---

_FA = FULLY_ASYNC
#: The ``marked_timer`` of each disaggregated trainer's module (VeRL 0.9.1): start/end ranges
#: with the trainer's ``global_steps`` (the rollouter's: its parameter version), names with ``/``
#: renamed (:data:`nvtx_phases.naming.ASYNC_RENAMES`).
ASYNC_TIMERS: tuple[Hook, ...] = (
    Hook(f"{_FA}.fully_async_trainer", "marked_timer", "<async trainer phase>"),
    Hook(f"{_FA}.fully_async_rollouter", "marked_timer", "<rollouter phase>"),
    Hook("verl.experimental.separation.ray_trainer", "marked_timer", "<separated trainer phase>"),
    Hook(
        "verl.experimental.one_step_off_policy.ray_trainer", "marked_timer", "<one-step-off phase>"
    ),
)
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
#: Disaggregated runs' controllers, workers and rollout servers (:mod:`nvtx_phases.verl_async`):
#: each hook with the function that makes its wrapper from the original.
ASYNC_HOOKS: tuple[tuple[Hook, Callable[[Any], Any]], ...] = (
    (
        Hook(f"{_FA}.fully_async_trainer", "FullyAsyncTrainer.__init__", "<pool mark trainer>"),
        call_then(after_trainer_init),
    ),
    (
        Hook(
            f"{_FA}.fully_async_trainer",
            "FullyAsyncTrainer._collect_metrics_from_samples",
            "<samples mark>",
        ),
        wrap_collect_samples,
    ),
    (
        Hook(f"{_FA}.fully_async_rollouter", "FullyAsyncRollouter.__init__", "<pool mark rollout>"),
        call_then(after_rollouter_init),
    ),
    (
        Hook(
            f"{_FA}.fully_async_rollouter",
            "FullyAsyncRollouter._init_async_objects",
            "<staleness_wait / gen>",
        ),
        call_then(after_init_async_objects),
    ),
    (
        Hook(f"{_FA}.fully_async_rollouter", "FullyAsyncRollouter.load_checkpoint", "<version>"),
        call_then(after_rollouter_load_checkpoint),
    ),
    (
        Hook(f"{_FA}.fully_async_rollouter", "FullyAsyncRollouter.reset_staleness", "version"),
        wrap_reset_staleness,
    ),
    (
        Hook(
            f"{_FA}.fully_async_rollouter",
            "FullyAsyncRollouter._streaming_generation_main",
            "<version / gen>",
        ),
        wrap_streaming_main,
    ),
    (
        Hook(f"{_FA}.fully_async_rollouter", "FullyAsyncRollouter.fit", "<version end>"),
        wrap_rollouter_fit,
    ),
    (
        Hook(
            "verl.experimental.one_step_off_policy.ray_trainer",
            "OneStepOffRayTrainer.__init__",
            "<pool mark trainer>",
        ),
        call_then(after_trainer_init),
    ),
    (
        Hook(
            "verl.experimental.separation.engine_workers",
            "DetachActorWorker.__init__",
            "<pool mark trainer>",
        ),
        call_then(after_detach_worker_init),
    ),
    (
        Hook(
            "verl.checkpoint_engine.base", "CheckpointEngineWorker.__init__", "<pool mark rollout>"
        ),
        call_then(after_checkpoint_worker_init),
    ),
    (
        Hook("verl.checkpoint_engine.base", "CheckpointEngineWorker.update_weights", "weight_sync"),
        phase("weight_sync"),
    ),
    (
        Hook(_VLLM_SERVER, "vLLMHttpServer.__init__", "<pool mark rollout>", optional=True),
        call_then(after_server_init),
    ),
    (
        Hook(_VLLM_SERVER, "vLLMHttpServer.abort_all_requests", "param_sync", optional=True),
        wrap_server_abort,
    ),
    (
        Hook(
            _VLLM_SERVER, "vLLMHttpServer.open_submission_gate", "<param_sync end>", optional=True
        ),
        wrap_server_gate,
    ),
)
