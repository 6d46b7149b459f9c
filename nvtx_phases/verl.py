r"""Mark every VeRL step, phase and subphase with NVTX ranges, without editing VeRL.

Written and tested against VeRL 0.9.1 (``TESTED_VERSIONS``). ``install()`` wraps:

- trainer side: ``verl.trainer.ppo.ray_trainer.marked_timer``, the context manager VeRL's
  ``RayPPOTrainer.fit`` opens around ``step, gen, reward, old_log_prob, ref, values, adv,
  update_critic, update_actor, update_weights, testing, save_checkpoint``: each becomes one range in
  the ``nvtx_phases`` domain carrying the trainer's ``global_steps`` (VeRL's own timing is kept;
  its own NVTX range for the same name is replaced by this one, so a phase is not marked twice);
- worker side: the methods of :data:`HOOKS` (log-prob, update, weight sync, mini-batches,
  forward, backward, optimizer step, rollout KV-cache wake/sleep, generation, reward model,
  rule-based reward function).

Enable it in every Ray worker (VeRL runs its trainer loop and workers as Ray actors) with one
override of VeRL's launch command::

    python -m verl.trainer.main_ppo ... \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=nvtx_phases.verl.install

A hook whose target moved in another VeRL release fails loudly, naming the attribute; a target
in a module whose optional backend is not installed (vLLM, SGLang, Megatron) is skipped.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from nvtx_phases import verl_async
from nvtx_phases.errors import HookError
from nvtx_phases.hook import Hook
from nvtx_phases.lengths_record import record_lengths, settings_from_env, write_reward_timings
from nvtx_phases.marking import current_step, phase

TESTED_VERSIONS = ("0.9.1",)
#: Attribute of every wrapper: the key of its original in the registry (:func:`original_of`).
#: A string, not the original itself: Ray copies a method's ``__dict__`` into the tracing wrapper
#: it pickles by value, and the original (whose qualified name now leads to the wrapper) would
#: then be pickled by value too, with its globals (``torch.distributed.config`` cannot be).
WRAPPED_MARK = "__nvtx_phases_original__"


#: Worker- and driver-side subphases (VeRL 0.9.1).
HOOKS: tuple[Hook, ...] = (
    Hook(
        "verl.workers.engine_workers", "ActorRolloutRefWorker.compute_log_prob", "compute_log_prob"
    ),
    Hook(
        "verl.workers.engine_workers",
        "ActorRolloutRefWorker.compute_ref_log_prob",
        "compute_ref_log_prob",
    ),
    Hook("verl.workers.engine_workers", "ActorRolloutRefWorker.update_actor", "update_actor"),
    Hook("verl.workers.engine_workers", "ActorRolloutRefWorker.update_weights", "weight_sync"),
    Hook("verl.workers.engine_workers", "TrainingWorker.train_batch", "train_batch"),
    Hook("verl.workers.engine_workers", "TrainingWorker.train_mini_batch", "mini_batch"),
    Hook("verl.workers.engine_workers", "TrainingWorker.infer_batch", "infer_batch"),
    Hook(
        "verl.workers.engine.fsdp.transformer_impl",
        "FSDPEngine.forward_backward_batch",
        "micro_batches",
    ),
    Hook(
        "verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead.forward_step", "forward"
    ),
    Hook(
        "verl.workers.engine.fsdp.transformer_impl", "FSDPEngine.optimizer_step", "optimizer_step"
    ),
    Hook("torch", "Tensor.backward", "backward"),
    Hook("verl.workers.rollout.replica", "RolloutReplica.wake_up", "kv_cache_wake"),
    Hook("verl.workers.rollout.replica", "RolloutReplica.sleep", "kv_cache_sleep"),
    Hook(
        "verl.experimental.agent_loop.agent_loop",
        "AgentLoopManager.generate_sequences",
        "generation",
    ),
    Hook("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._compute_reward_colocate", "rm_forward"),
    Hook(
        "verl.experimental.reward_loop.reward_loop", "RewardLoopWorker.compute_score", "reward_fn"
    ),
    Hook(
        "verl.workers.rollout.vllm_rollout.vllm_async_server",
        "vLLMHttpServer.wake_up",
        "kv_cache_wake",
        optional=True,
    ),
    Hook(
        "verl.workers.rollout.vllm_rollout.vllm_async_server",
        "vLLMHttpServer.sleep",
        "kv_cache_sleep",
        optional=True,
    ),
)
TRAINER_TIMER = Hook("verl.trainer.ppo.ray_trainer", "marked_timer", "<trainer phase>")

#: The disaggregated trainers' timers and hooks (:mod:`nvtx_phases.verl_async`).
ASYNC_TIMERS = verl_async.ASYNC_TIMERS
ASYNC_HOOKS = verl_async.ASYNC_HOOKS


@dataclass
class _Installed:
    owner: Any
    name: str
    original: Any
    owned: bool  # the attribute lived on ``owner`` itself (not inherited)


_installed: dict[str, _Installed] = {}
#: Where lengths (and reward timings) are recorded, when recording is on (a one-item list).
_lengths_folder: list[str] = []
_skipped: dict[str, str] = {}


def _resolve(hook: Hook) -> tuple[Any, str, Any] | None:
    """(owner, attribute name, current value), or None for an optional module that won't import."""
    try:
        module = importlib.import_module(hook.module)
    except Exception as exc:  # VeRL raises ValueError, not ImportError, when vLLM is absent
        if hook.optional:
            _skipped[hook.target] = f"module not importable ({exc.__class__.__name__}: {exc})"
            return None
        raise HookError(f"cannot import {hook.module} for {hook.target}: {exc}") from exc
    owner: Any = module
    *parents, name = hook.qualname.split(".")
    for part in parents:
        if not hasattr(owner, part):
            raise HookError(_moved(hook, f"{owner.__name__}.{part}"))
        owner = _plain_class(getattr(owner, part))
    if not hasattr(owner, name):
        raise HookError(_moved(hook, hook.target))
    return owner, name, getattr(owner, name)


def _plain_class(owner: Any) -> Any:
    """The class a module-level ``@ray.remote`` made, whose methods its actors run, else ``owner``.

    Ray's actor class keeps the decorated class's subclass (``modified_class``), with a copy
    of each method wrapped for tracing; it pickles that subclass by value when an actor is
    created. A method wrapped there, in the process that creates the actor, is what the actor's
    process runs.
    """
    metadata = getattr(owner, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    return modified if isinstance(modified, type) else owner


def _moved(hook: Hook, missing: str) -> str:
    return (
        f"{missing} not found in verl {_verl_version()} (hooks written for verl "
        f"{', '.join(TESTED_VERSIONS)}); cannot mark phase '{hook.phase}'"
    )


def _verl_version() -> str:
    verl = sys.modules.get("verl") or importlib.import_module("verl")
    return getattr(verl, "__version__", "unknown")


def _wrap(hook: Hook, make: Callable[[Any], Any] | None = None) -> None:
    resolved = _resolve(hook)
    if resolved is None or hook.target in _installed:
        return
    owner, name, current = resolved
    if hasattr(current, WRAPPED_MARK):
        return  # installed by an earlier import of this module
    wrapper = make(current) if make is not None else phase_wrapper(hook.phase, current)
    setattr(wrapper, WRAPPED_MARK, hook.target)
    owned = name in vars(owner)
    setattr(owner, name, wrapper)
    _installed[hook.target] = _Installed(owner, name, current, owned)


def phase_wrapper(name: str, current: Any) -> Any:
    """``phase(name)`` around ``current``; for a VeRL ``@auto_await`` method, one that keeps it.

    ``auto_await`` (``verl.utils.ray_utils``) returns its coroutine to a caller that is a
    coroutine and runs it to the end for any other. Behind a plain wrapper it would see the
    wrapper as its caller and hand an awaiting caller (one-step-off's trainer awaits
    ``AgentLoopManager.generate_sequences``) a result instead of an awaitable. So a coroutine
    caller gets the range around the coroutine, any other the range around the call, as before.
    """
    inner = getattr(current, "__wrapped__", None)
    if inspect.iscoroutinefunction(current) or not inspect.iscoroutinefunction(inner):
        return phase(name)(current)
    around_call, around_coroutine = phase(name)(current), phase(name)(inner)

    @functools.wraps(current)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_flags & inspect.CO_COROUTINE:
            return around_coroutine(*args, **kwargs)
        return around_call(*args, **kwargs)

    return wrapper


def _global_step(frame: Any) -> int | None:
    """``self.global_steps`` of the trainer whose ``fit`` opened the timer, if any."""
    trainer = frame.f_locals.get("self") if frame is not None else None
    value = getattr(trainer, "global_steps", None)
    return value if isinstance(value, int) else None


def _trainer_timer(timing_only: Callable[..., Any]) -> Callable[..., Any]:
    """A drop-in for ``marked_timer``: VeRL's timing, plus one nvtx_phases range with the step."""

    @contextmanager
    def _both(name: str, step_index: int | None, timer: Any) -> Iterator[None]:
        started = time.perf_counter()
        with phase(name, step=step_index), timer:
            yield
        if name == "reward" and step_index is not None and _lengths_folder:
            write_reward_timings(_lengths_folder[0], step_index, time.perf_counter() - started)

    @functools.wraps(timing_only)
    def marked_timer(name: str, timing_raw: dict[str, float], *args: Any, **kwargs: Any) -> Any:
        step_index = _global_step(sys._getframe(1))
        return _both(str(name), step_index, timing_only(name, timing_raw, *args, **kwargs))

    return marked_timer


def install(*, strict: bool = True, record_lengths_to: str | None = None) -> list[str]:
    """Wrap every hook target; returns the wrapped targets. Idempotent.

    ``strict=False`` turns a missing target into a warning instead of :class:`HookError`.
    ``record_lengths_to`` (or ``$NVTX_PHASES_LENGTHS_DIR``) also writes each step's prompt and
    response lengths there (PolyTrace layout; ``$NVTX_PHASES_DP_SIZE``,
    ``$NVTX_PHASES_N_SAMPLING`` refine rank and grouping). Usable as Ray's
    ``worker_process_setup_hook`` (called with no arguments).
    """
    version = _verl_version()
    if version not in TESTED_VERSIONS:
        warnings.warn(
            f"nvtx_phases.verl hooks are tested with verl {', '.join(TESTED_VERSIONS)}, "
            f"not {version}; every target is checked, missing ones are reported",
            stacklevel=2,
        )
    makers: dict[Hook, Callable[[Any], Any] | None] = dict(ASYNC_HOOKS)
    for hook in (TRAINER_TIMER, *HOOKS, *ASYNC_TIMERS, *makers):
        try:
            if hook is TRAINER_TIMER or hook in ASYNC_TIMERS:
                _install_timer(hook)
            else:
                _wrap(hook, makers.get(hook))
        except HookError as exc:
            if strict:
                raise
            warnings.warn(str(exc), stacklevel=2)
    folder, dp_size, n_sampling = settings_from_env()
    folder = record_lengths_to or folder
    if folder:
        _install_length_recorder(folder, dp_size=dp_size, n_sampling=n_sampling)
    return sorted(_installed)


LENGTHS_HOOK = Hook(
    "verl.experimental.agent_loop.agent_loop", "AgentLoopManager.generate_sequences", "<lengths>"
)


def _install_length_recorder(folder: str, *, dp_size: int, n_sampling: int) -> None:
    """Record lengths of every generated batch (wrapping the phase range's wrapper)."""
    key = LENGTHS_HOOK.target + "#lengths"
    resolved = _resolve(LENGTHS_HOOK)
    if resolved is None or key in _installed:
        return
    owner, name, current = resolved
    _lengths_folder[:] = [folder]

    @functools.wraps(current)
    async def generate_and_record(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        output = await current(self, prompts, *args, **kwargs)
        step_index = current_step()
        if step_index is not None:
            record_lengths(output, step_index, folder, dp_size=dp_size, n_sampling=n_sampling)
        return output

    setattr(generate_and_record, WRAPPED_MARK, key)
    setattr(owner, name, generate_and_record)
    _installed[key] = _Installed(owner, name, current, name in vars(owner))


def _install_timer(hook: Hook) -> None:
    """Replace a module's ``marked_timer`` by VeRL's timing-only one plus the hook's range."""
    resolved = _resolve(hook)
    if resolved is None or hook.target in _installed:
        return
    owner, name, current = resolved
    performance = importlib.import_module("verl.utils.profiler.performance")
    make = _trainer_timer if hook is TRAINER_TIMER else verl_async.async_timer
    wrapper = make(performance.marked_timer)
    setattr(wrapper, WRAPPED_MARK, hook.target)
    setattr(owner, name, wrapper)
    _installed[hook.target] = _Installed(owner, name, current, owned=True)


def original_of(wrapper: Any) -> Any:
    """The function a wrapper installed by :func:`install` replaced (``HookError`` if none)."""
    key = getattr(wrapper, WRAPPED_MARK, None)
    if not isinstance(key, str) or key not in _installed:
        raise HookError(f"{wrapper!r} is not a wrapper installed by nvtx_phases.verl")
    return _installed[key].original


def uninstall() -> None:
    """Restore every original attribute."""
    _lengths_folder.clear()
    for target in reversed(list(_installed)):  # last wrapped, first restored
        entry = _installed.pop(target)
        if entry.owned:
            setattr(entry.owner, entry.name, entry.original)
        else:
            delattr(entry.owner, entry.name)


def installed() -> dict[str, str]:
    """Wrapped targets → phase name, and skipped optional targets → why."""
    every = (TRAINER_TIMER, *HOOKS, *ASYNC_TIMERS, *(h for h, _ in ASYNC_HOOKS))
    names = {h.target: h.phase for h in every}
    names[LENGTHS_HOOK.target + "#lengths"] = "<length recorder>"
    return {
        **{t: names[t] for t in _installed},
        **{t: f"skipped: {why}" for t, why in _skipped.items()},
    }
