"""The phase naming convention, shared by the capture side and the analysis side.

A training step is one NVTX range named ``step``; phases nest inside it and subphases inside
phases (``step > phase > subphase``), so a range's *path* reads ``step/gen/weight_sync``. Ranges
emitted by :mod:`nvtx_phases` live in the NVTX domain :data:`DOMAIN` and carry the step index as
their int64 payload, so the analysis needs no name parsing. VeRL's own range names (trainer side,
worker stage labels and older worker method names) are known phases too.
"""

from __future__ import annotations

#: NVTX domain of every range this package emits.
DOMAIN = "nvtx_phases"
#: Name of the range that spans one training step.
STEP = "step"
#: Separator of a range path (``step/gen/weight_sync``).
PATH_SEP = "/"

#: Phases VeRL's trainer marks in its driver process (``marked_timer`` names). VeRL 0.9.1's
#: ``RayPPOTrainer.fit`` marks all but ``gen_max`` (older releases' REMAX baseline) and the
#: ``switch_*`` ones (its ``trainer.v1`` separate-async trainer); ``ref`` is
#: ``str(Role.RefPolicy)``. ``start_profile``/``stop_profile`` enclose the profiler's start and
#: stop, outside ``step``; ``dump_rollout_generations`` writes generations to disk.
VERL_TRAINER_PHASES: tuple[str, ...] = (
    "step",
    "gen",
    "gen_max",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "testing",
    "save_checkpoint",
    "dump_rollout_generations",
    "start_profile",
    "stop_profile",
    "switch_to_trainer",
    "switch_wait",
    "switch_to_rollout",
)
#: Stage labels VeRL 0.9.1's own nsys profiler names worker ranges by: its
#: ``DistProfiler.annotate(role=...)`` range is ``message or role or func.__name__``.
#: ``ActorRolloutRefWorker.compute_log_prob`` / ``compute_ref_log_prob`` / ``update_actor`` and
#: ``TrainingWorker.train_batch`` (per mini-batch of a critic update; inside ``actor_update`` too
#: only if the actor's inner worker's profiler were started, which 0.9.1's trainer never does) in
#: ``verl/workers/engine_workers.py``; ``TinkerTrainingWorker.forward_backward`` in
#: ``engine_workers_tinker.py``. 0.9.1 marks no other worker range: the critic's values
#: (``infer_batch``), the reward loop and the rollout servers run unannotated.
VERL_PROFILER_ROLES: tuple[str, ...] = (
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "actor_update",
    "train_batch",
    "forward_backward",
)
#: Methods VeRL's workers ran under ``DistProfiler.annotate`` before the stage labels (names as
#: they appear in NVTX; also the names nvtx_phases's VeRL hooks give the 0.9.1 worker methods).
VERL_WORKER_PHASES: tuple[str, ...] = (
    "generate_sequences",
    "compute_log_prob",
    "compute_ref_log_prob",
    "compute_values",
    "compute_rm_score",
    "update_actor",
    "update_critic",
)
#: Subphases the nvtx_phases VeRL hooks emit inside worker phases.
SUBPHASES: tuple[str, ...] = (
    "weight_sync",
    "kv_cache_wake",
    "kv_cache_sleep",
    "generation",
    "train_batch",
    "infer_batch",
    "mini_batch",
    "micro_batch",
    "micro_batches",
    "forward",
    "backward",
    "optimizer_step",
    "rm_forward",
    "reward_fn",
)

#: Phases of asynchronous (disaggregated) RL, where a trainer and a rollouter drive separate GPU
#: pools. VeRL 0.9.1's ``FullyAsyncTrainer.fit_step`` marks ``wait_for_enough_samples`` and
#: ``timing_s/param_sync`` (read as ``param_sync``: a ``/`` would split the phase path; its
#: ``gen`` takes samples from the rollouter's queue). The rollouter's ranges are nvtx_phases's
#: VeRL hooks' (:mod:`nvtx_phases.verl`), each carrying the parameter version as its step index:
#: ``version`` spans one parameter version (a step of the rollout axis: :data:`VERSION`), inside
#: it ``gen`` (generating), ``param_sync`` (paused for the weight update: the refit bubble),
#: ``partial_pause`` (in-flight samples interrupted for the update, with partial rollout),
#: ``staleness_wait`` (the staleness limit reached: waiting for the trainer to consume) and
#: ``validate``.
ASYNC_PHASES: tuple[str, ...] = (
    "wait_for_enough_samples",
    "param_sync",
    "partial_pause",
    "staleness_wait",
    "validate",
)
#: Names VeRL's async trainer and rollouter time under that are not path-safe, and the phase
#: each counts as.
ASYNC_RENAMES: dict[str, str] = {
    "timing_s/param_sync": "param_sync",
    "rollouter/validate_time": "validate",
}
#: The step-like range of the rollout axis: one per parameter version of the rollouter.
VERSION = "version"

#: Message prefix of the mark a process emits once (in domain :data:`DOMAIN`) to say which GPU
#: pool it belongs to and, for a process that drives GPUs, which ones (their UUIDs, as NVML
#: spells them: ``GPU-…``): ``nvtx_phases.pool role=rollout gpus=GPU-8f…,GPU-1c…``. Processes of
#: one role form one pool (:func:`pool_mark_text` writes it, :data:`POOL_MARK_PATTERN` reads it).
POOL_MARK = "nvtx_phases.pool"
#: Regular expression with two groups (``role``, comma-separated ``gpus`` or empty) of a pool mark.
POOL_MARK_PATTERN = r"^nvtx_phases\.pool role=([A-Za-z0-9_.:-]+)(?: gpus=([A-Za-z0-9_.:,-]*))?$"
#: Message prefix of the mark the trainer emits per step for the samples it trains on:
#: ``nvtx_phases.samples step=12 version=3 versions=2:32,3:96`` (its step, its parameter version,
#: and how many samples each parameter version generated). Staleness = version − sample version.
SAMPLES_MARK = "nvtx_phases.samples"
#: Regular expression with three groups (``step``, ``version``, ``versions``) of a samples mark.
SAMPLES_MARK_PATTERN = (
    r"^nvtx_phases\.samples step=(-?\d+) version=(-?\d+) versions=((?:-?\d+:\d+,?)*)$"
)
_ROLE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")


def pool_mark_text(role: str, gpus: tuple[str, ...] | list[str] = ()) -> str:
    """The NVTX mark message naming a process's pool ``role`` and the GPUs it drives."""
    if not role or not set(role) <= _ROLE_CHARS:
        raise ValueError(f"pool role {role!r}: use letters, digits and _ . : - only")
    text = f"{POOL_MARK} role={role}"
    listed = [g for g in gpus if g]
    if any(not set(g) <= _ROLE_CHARS for g in listed):
        raise ValueError(f"GPU ids {listed!r}: use letters, digits and _ . : - only")
    return f"{text} gpus={','.join(listed)}" if listed else text


def samples_mark_text(step: int, version: int, sample_versions: dict[int, int]) -> str:
    """The NVTX mark message for the samples trainer step ``step`` (at ``version``) trains on."""
    versions = ",".join(f"{int(v)}:{int(n)}" for v, n in sorted(sample_versions.items()))
    return f"{SAMPLES_MARK} step={int(step)} version={int(version)} versions={versions}"


#: Colors (ARGB) per phase, so the same phase looks the same in every Nsight timeline.
PHASE_COLORS: dict[str, int] = {
    "step": 0xFF4C72B0,
    "gen": 0xFF55A868,
    "generate_sequences": 0xFF55A868,
    "reward": 0xFFC44E52,
    "compute_rm_score": 0xFFC44E52,
    "old_log_prob": 0xFF8172B2,
    "compute_log_prob": 0xFF8172B2,
    "ref": 0xFFCCB974,
    "compute_ref_log_prob": 0xFFCCB974,
    "values": 0xFF64B5CD,
    "compute_values": 0xFF64B5CD,
    "adv": 0xFFB5179E,  # magenta: its old grey read as update_weights' brown and as "other"
    "update_actor": 0xFFDD8452,
    "update_critic": 0xFFDA8BC3,
    "update_weights": 0xFF937860,
    # asynchronous RL (the rollouter's axis and what the pools wait on)
    "version": 0xFF4C72B0,
    "param_sync": 0xFF0072B2,
    "weight_sync": 0xFF0072B2,
    "staleness_wait": 0xFFE69F00,
    "partial_pause": 0xFFBCBD22,
    "validate": 0xFF1B9E77,
    "wait_for_enough_samples": 0xFF8B0000,
}
DEFAULT_COLOR = 0xFF999999


def phase_color(name: str) -> int:
    """ARGB color of a phase (a fixed grey for names without one)."""
    return PHASE_COLORS.get(name, DEFAULT_COLOR)


#: Message prefix of the NVTX marks the power sampler emits so the analysis can map its clock
#: onto the trace's (:func:`clock_mark_text` writes them, :data:`CLOCK_MARK_PATTERN` reads them).
CLOCK_MARK = "nvtx_phases.power_clock"
#: Regular expression with two groups (``mono_ns``, ``wall_ns``) matching a clock mark.
CLOCK_MARK_PATTERN = r"nvtx_phases\.power_clock mono_ns=(\d+) wall_ns=(\d+)"


def clock_mark_text(mono_ns: int, wall_ns: int) -> str:
    """The NVTX mark message that carries the sampler's clock reading."""
    return f"{CLOCK_MARK} mono_ns={mono_ns} wall_ns={wall_ns}"


#: Columns of the power sampler's Parquet, in order (``uuid`` and later are absent from files of
#: older samplers).
SAMPLER_COLUMNS = (
    "host",
    "pid",
    "device",
    "uuid",
    "wall_ns",
    "mono_ns",
    "power_w",
    "energy_mj",
    "sm_clock_mhz",
    "gpu_util_pct",
    "mem_util_pct",
)
#: The sampler columns every power file must have.
REQUIRED_SAMPLER_COLUMNS = ("host", "pid", "device", "wall_ns", "mono_ns", "power_w", "energy_mj")
