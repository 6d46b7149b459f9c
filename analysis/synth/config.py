"""The synthetic GRPO run's knobs and fixed layout (phases, processes, decode graphs)."""

from __future__ import annotations

from dataclasses import dataclass

from .constants import MS, US

WORKER_PID0 = 2000
FIRST_STEP_NS = 5 * MS

#: Trainer phase → (worker range name or None when the phase uses no GPU, length in ms).
GRPO_PHASES: tuple[tuple[str, str | None, float], ...] = (
    ("gen", "generate_sequences", 24.0),
    ("reward", None, 3.0),
    ("old_log_prob", "compute_log_prob", 6.0),
    ("ref", "compute_ref_log_prob", 6.0),
    ("adv", None, 1.0),
    ("update_actor", "update_actor", 16.0),
    ("update_weights", "update_weights", 4.0),
)
#: (graphId, graphExecId) of the captured decode graphs (one per padded batch size).
DECODE_GRAPHS = ((3, 7), (4, 8))


@dataclass(frozen=True)
class SynthConfig:
    """Knobs of the synthetic run (defaults: the bundled sample)."""

    steps: int = 3
    ranks: int = 2
    kernels_per_phase: int = 40
    seed: int = 7
    split_files: bool = False
    #: Extra session-start offset of file i (ns) when split; models unsynchronized launches.
    file_start_stagger_ns: int = 3 * MS
    warmup_kernels: int = 4
    #: Rank r's generation lasts (1 - skew * r / ranks) of the longest.
    length_skew: float = 0.35
    #: Write NVML-style power samples (and clock marks in the driver) with known energy.
    power: bool = True
    power_interval_ns: int = 100 * US
    idle_power_w: float = 90.0
    #: The sampler's monotonic clock minus the trace clock; recovered from the clock marks.
    power_mono_offset_ns: int = 987_654_321_000
    #: The sampler host's wall clock minus the trace's (an NTP error the marks make irrelevant).
    power_wall_skew_ns: int = 2_500_000
    clock_mark_every_ns: int = 20 * MS
    #: Write PolyTrace-layout response lengths (``<stem>_lengths/``), rank 0 longest like its
    #: generation time; ``length_cap`` is the rollout's max response length.
    lengths: bool = True
    length_cap: int = 4096
    #: Score rewards with a learned reward model on the GPUs (``compute_rm_score`` in
    #: ``reward``) instead of a rule function on the CPU.
    reward_model: bool = False
    #: Run most decode kernels of ``generate_sequences`` as CUDA graph executions
    #: (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``), the straddling one included.
    graphs: bool = False
    #: Write nsys's CUDA memory-usage table (``CUDA_GPU_MEMORY_USAGE_EVENTS``, as
    #: ``--cuda-memory-usage=true``) with a known profile per phase (:mod:`analysis.synth.memory`)
    #: and its ground truth per phase row and GPU.
    memory: bool = False
