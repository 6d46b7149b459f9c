"""The synthetic GRPO run's CUDA memory allocations and frees (``nsys --cuda-memory-usage=true``).

A known memory profile per rank (its own GPU), laid over the run's ranges; no random draws, so
the rest of the run is the same with or without it. Byte counts differ by rank, so each GPU's
rows differ. Per rank r:

- before the first step: 4 MiB of Device Static memory (module globals) and the model weights
  (2 GiB + r × 64 MiB, Device);
- each step: an 8 MiB batch buffer allocated 20 µs after the ``step`` range starts (before its
  first phase, so only the ``step`` row sees it change) and freed 50 µs before it ends;
- ``gen``: the rollout's KV cache in 4 blocks of (256 − 32 r) MiB, the first allocated exactly at
  the driver's ``gen`` start (counted in ``gen``, not in its entry level), the others at 1/4, 2/4
  and 3/4 of the worker's ``generate_sequences`` range; all freed in one call where the worker
  range ends (the engine's sleep);
- ``old_log_prob``: a 64 MiB logits buffer from 50 µs into ``compute_log_prob`` to its end;
  ``ref``: the same in ``compute_ref_log_prob``, freed exactly at the driver's ``ref`` end (so
  outside ``ref``: a row covers ``[start, end)``);
- ``update_actor``: optimizer state (1 GiB + r × 16 MiB) allocated 20 µs into the range and kept;
  4 micro-batches each allocating 128 MiB of activations (forward) and freeing them (backward); a
  32 MiB workspace allocated and freed at the same ns (it counts in the peak);
- ``update_weights`` (the offload phase): frees the optimizer state (offloaded to the host)
  halfway through, through a 1 GiB *pinned* host staging buffer (``memKind`` 1, not device
  memory: must not count);
- ``reward`` (a CPU phase): a 256 MiB pinned buffer allocated in it and freed in ``adv``
  (must not count); with a reward model, ``compute_rm_score`` holds its 512 MiB of weights.

Every byte allocated in a step is freed in it: each step starts at the weights' level.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import WORKER_PID0
from .constants import US
from .timeline import Range, Timeline

#: ``ENUM_CUDA_MEM_KIND`` ids the profile uses
MEM_KIND_PINNED, MEM_KIND_DEVICE, MEM_KIND_DEVICE_STATIC = 1, 2, 5
#: ``ENUM_CUDA_DEV_MEM_EVENT_OPER`` ids
MEM_ALLOC, MEM_FREE = 0, 1
MIB = 1 << 20
GIB = 1 << 30
_ADDRESS0 = 0x7F00_0000_0000


@dataclass(frozen=True)
class MemoryEvent:
    """One ``CUDA_GPU_MEMORY_USAGE_EVENTS`` row on the run clock."""

    pid: int
    gpu: int
    ts: int
    nbytes: int
    mem_kind: int
    operation: int  # MEM_ALLOC or MEM_FREE
    address: int


class _Writer:
    """Collects one rank's events; allocations get fresh addresses, frees reuse them."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[MemoryEvent] = []
        self.next_address = _ADDRESS0 + rank * (1 << 40)
        #: the optimizer state's (address, bytes) from ``update_actor`` until it is offloaded
        self.optimizer: tuple[int, int] | None = None

    def alloc(self, ts: int, nbytes: int, kind: int = MEM_KIND_DEVICE) -> int:
        address = self.next_address
        self.next_address += 1 << 32
        self._add(ts, nbytes, kind, MEM_ALLOC, address)
        return address

    def free(self, ts: int, nbytes: int, address: int, kind: int = MEM_KIND_DEVICE) -> None:
        self._add(ts, nbytes, kind, MEM_FREE, address)

    def _add(self, ts: int, nbytes: int, kind: int, operation: int, address: int) -> None:
        pid = WORKER_PID0 + self.rank
        self.events.append(MemoryEvent(pid, self.rank, ts, nbytes, kind, operation, address))


def memory_events(tl: Timeline, ranks: int) -> list[MemoryEvent]:
    """Every rank's allocations and frees, in the order they are written (by time, stable)."""
    steps = [r for r in tl.driver if r.name == "step"]
    phases = {(r.step, r.name): r for r in tl.driver if r.name != "step"}
    found: list[MemoryEvent] = []
    for rank in range(ranks):
        w = _Writer(rank)
        w.alloc(400 * US, 4 * MIB, MEM_KIND_DEVICE_STATIC)
        w.alloc(500 * US, 2 * GIB + rank * 64 * MIB)
        for step in steps:
            batch = w.alloc(step.start + 20 * US, 8 * MIB)
            w.free(step.end - 50 * US, 8 * MIB, batch)
            _cpu_phases(w, phases, step.step)
        for r in tl.workers:
            if r.pid == WORKER_PID0 + rank:
                _worker_range(w, r, phases)
        found += w.events
    return sorted(found, key=lambda e: e.ts)  # stable: same-ns events keep their order


def _cpu_phases(w: _Writer, phases: dict[tuple[int | None, str], Range], step: int | None) -> None:
    """A pinned host buffer from ``reward`` to ``adv`` (host memory: not counted)."""
    reward, adv = phases.get((step, "reward")), phases.get((step, "adv"))
    if reward is not None and adv is not None:
        pinned = w.alloc(reward.start + 30 * US, 256 * MIB, MEM_KIND_PINNED)
        w.free(adv.start + 10 * US, 256 * MIB, pinned, MEM_KIND_PINNED)


def _worker_range(w: _Writer, r: Range, phases: dict[tuple[int | None, str], Range]) -> None:
    """The allocations and frees of one worker range (see the module doc)."""
    length = r.end - r.start
    if r.name == "generate_sequences":
        block = (256 - 32 * w.rank) * MIB
        kv = w.alloc(phases[(r.step, "gen")].start, block)
        for k in (1, 2, 3):
            w.alloc(r.start + k * length // 4, block)
        w.free(r.end, 4 * block, kv)  # the engine frees its whole cache at once
    elif r.name in ("compute_log_prob", "compute_ref_log_prob"):
        logits = w.alloc(r.start + 50 * US, 64 * MIB)
        end = r.end if r.name == "compute_log_prob" else phases[(r.step, "ref")].end
        w.free(end, 64 * MIB, logits)
    elif r.name == "update_actor":
        state = GIB + w.rank * 16 * MIB
        w.optimizer = (w.alloc(r.start + 20 * US, state), state)
        for m in range(4):
            forward = r.start + (2 * m + 1) * length // 9
            activations = w.alloc(forward, 128 * MIB)
            w.free(forward + length // 18, 128 * MIB, activations)
        middle = r.start + length // 2 + 1 * US
        workspace = w.alloc(middle, 32 * MIB)
        w.free(middle, 32 * MIB, workspace)
    elif r.name == "update_weights":
        staging = w.alloc(r.start + 10 * US, GIB, MEM_KIND_PINNED)
        if w.optimizer is not None:  # offloaded to the host
            address, state = w.optimizer
            w.free(r.start + length // 2, state, address)
            w.optimizer = None
        w.free(r.end - 10 * US, GIB, staging, MEM_KIND_PINNED)
    elif r.name == "compute_rm_score":
        weights = w.alloc(r.start + 10 * US, 512 * MIB)
        w.free(r.end, 512 * MIB, weights)
