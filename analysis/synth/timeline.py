"""The run clock's contents, shared by both captures: NVTX ranges, GPU operations, step layout.

:class:`Timeline` holds what a synthetic run did, in run-clock ns: the driver's step and phase
ranges, the workers' ranges, every GPU operation with its launch call, and the power model's
activity windows. Subclasses (:mod:`analysis.synth.model` and :mod:`analysis.synth.ray.model`)
decide what each phase runs; the step/phase layout and a trainer worker range's body are here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .constants import (
    COMPUTE_KERNELS,
    COMPUTE_STREAM,
    COPY_KIND_D2H,
    COPY_KIND_H2D,
    COPY_STREAM,
    DRIVER_PID,
    MS,
    NCCL_KERNELS,
    NCCL_STREAM,
    PHASE_GAP_NS,
    PHASE_POWER_W,
    STEP_GAP_NS,
    US,
    OpKind,
)
from .power_model import PowerKnobs, PowerModel

#: Trainer phase → (worker range name or None when no worker range runs, length in ms).
Phases = tuple[tuple[str, str | None, float], ...]
#: Compute kernel ``i`` of a worker range → (kind, (graphId, graphExecId)).
KernelKind = Callable[[int], tuple[OpKind, tuple[int, int]]]
#: Worker range → (bytes, copyKind, duration ns) of the copy it ends with before the D2H.
TailCopies = dict[str, tuple[int, int, int]]


@dataclass
class Range:
    """One NVTX push/pop range on the run clock."""

    pid: int
    tid: int
    name: str
    start: int
    end: int
    payload: int | None
    path: str
    step: int | None


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of one step as :meth:`Timeline.lay_steps` laid it out."""

    step: int
    index: int  # position in the step's phase list
    name: str
    worker: str | None  # the worker range it runs, or None
    start: int  # the driver's phase range [start, end)
    end: int
    next_start: int  # where the next phase starts (after the gap)


@dataclass
class GpuOp:
    """One GPU operation and its launch call, on the run clock."""

    kind: OpKind
    pid: int
    tid: int  # the launching thread
    gpu: int  # physical GPU index on the host
    stream: int
    start: int
    end: int
    call_start: int
    call_end: int
    correlation: int
    name: tuple[str, str] = ("", "")  # (short, demangled) for kernels
    nbytes: int = 0
    copy_kind: int = 0
    worker_range: int = -1  # index into the worker ranges enclosing the launch call, else -1
    graph: tuple[int, int] = (0, 0)  # (graphId, graphExecId) of a graph execution


def _eager(i: int) -> tuple[OpKind, tuple[int, int]]:
    return "kernel", (0, 0)


class Timeline:
    """What the run did: driver and worker ranges, GPU operations, power activity."""

    #: Length of a graph launch call (other launch calls take 4 µs).
    graph_call_ns = 4 * US

    def __init__(self, knobs: PowerKnobs, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.ops: list[GpuOp] = []
        self.driver: list[Range] = []
        self.workers: list[Range] = []
        self.power = PowerModel(knobs)
        self.next_corr: dict[int, int] = {}

    # --- operations and ranges -------------------------------------------------------------

    def launch_tid(self, pid: int) -> int:
        """The thread of ``pid`` that launches GPU work (its main thread)."""
        return pid

    def op(
        self,
        kind: OpKind,
        pid: int,
        gpu: int,
        start: int,
        end: int,
        *,
        stream: int = COMPUTE_STREAM,
        call_start: int | None = None,
        name: tuple[str, str] = ("", ""),
        nbytes: int = 0,
        copy_kind: int = 0,
        worker_range: int = -1,
        graph: tuple[int, int] = (0, 0),
    ) -> GpuOp:
        """Add one operation launched at ``call_start`` (default 6 µs before it starts)."""
        call = int(start - 6 * US if call_start is None else call_start)
        correlation = self.next_corr.get(pid, 1)
        self.next_corr[pid] = correlation + 1
        o = GpuOp(
            kind=kind,
            pid=pid,
            tid=self.launch_tid(pid),
            gpu=gpu,
            stream=stream,
            start=int(start),
            end=int(end),
            call_start=call,
            call_end=call + (self.graph_call_ns if kind == "graph" else 4 * US),
            correlation=correlation,
            name=name,
            nbytes=int(nbytes),
            copy_kind=copy_kind,
            worker_range=worker_range,
            graph=graph,
        )
        self.ops.append(o)
        return o

    def add_worker_range(
        self, pid: int, name: str, start: int, end: int, step: int, *, tid: int | None = None
    ) -> int:
        """Add a worker range (path = its name); return its index for its operations."""
        self.workers.append(
            Range(pid, pid if tid is None else tid, name, start, end, None, name, step)
        )
        return len(self.workers) - 1

    @property
    def duration(self) -> int:
        """Run length (ns on the run clock): the last event plus 1 ms."""
        return max(max(o.end for o in self.ops), max(r.end for r in self.driver)) + 1 * MS

    def sample_times(self) -> np.ndarray:
        """Instants (run clock) the power sampler read every GPU."""
        return self.power.sample_times(self.duration)

    def clock_marks(self) -> list[tuple[int, int, int]]:
        """(run ns, sampler mono ns, sampler wall ns) of each clock mark in the driver."""
        return self.power.clock_marks(self.duration)

    # --- steps -------------------------------------------------------------------------------

    def lay_steps(self, t: int, steps: int, phases: Phases) -> None:
        """Lay out ``steps`` steps of ``phases`` from ``t``, with their driver ranges.

        Each phase lasts its length ±10% and is followed by a 200 µs gap; :meth:`phase` fills
        it in (it may draw from ``rng``: draws interleave phase by phase), then
        :meth:`after_step` sees where each step ended.
        """
        for step in range(1, steps + 1):
            step_start = t
            t += 50 * US
            spans = []
            for p, (phase, worker, length_ms) in enumerate(phases):
                p_start = t
                p_end = p_start + int(length_ms * MS * self.rng.uniform(0.9, 1.1))
                spans.append((phase, p_start, p_end))
                next_start = p_end + PHASE_GAP_NS
                self.phase(PhaseSpan(step, p, phase, worker, p_start, p_end, next_start))
                t = next_start
            step_end = t + 100 * US
            self.driver.append(
                Range(DRIVER_PID, DRIVER_PID, "step", step_start, step_end, step, "step", step)
            )
            for phase, s, e in spans:
                self.driver.append(
                    Range(DRIVER_PID, DRIVER_PID, phase, s, e, None, f"step/{phase}", step)
                )
            self.after_step(step_end)
            t = step_end + STEP_GAP_NS

    def phase(self, span: PhaseSpan) -> None:
        """What runs in one phase of one step."""

    def after_step(self, step_end: int) -> None:
        """What runs after a step ends, before the gap to the next."""

    # --- a trainer worker range ------------------------------------------------------------

    def trainer_range(
        self,
        pid: int,
        gpu: int,
        name: str,
        w_start: int,
        w_end: int,
        step: int,
        *,
        kernels: int,
        tail: TailCopies,
        kernel_kind: KernelKind = _eager,
        straddle_to: int | None = None,
        straddle_graph: tuple[int, int] | None = None,
        gap_rounding: Callable[[float], int] = int,
    ) -> None:
        """A worker range: batch in, compute kernels, NCCL beside them, results out.

        ``straddle_to``: one more kernel (or an execution of ``straddle_graph``) launched at the
        end that runs until then, past the range. ``gap_rounding`` turns the mean gap between
        kernels into ns (the GRPO run floors it, the Ray capture truncates; they differ only
        when the kernels do not fit the range, and each keeps its own for identical output).
        """
        idx = self.add_worker_range(pid, name, w_start, w_end, step)
        self.power.add(gpu, w_start, w_end, PHASE_POWER_W.get(name, 0.0))
        t = self._batch_in(pid, gpu, w_start + 10 * US, idx)
        starts, ends, durations = self._compute(
            pid, gpu, t, w_end - 150 * US, kernels, idx, kernel_kind, gap_rounding
        )
        if straddle_to is not None:  # an async kernel that runs into the next phase
            self.op(
                "kernel" if straddle_graph is None else "graph",
                pid,
                gpu,
                ends[-1] + 8 * US,
                straddle_to,
                call_start=ends[-1] + 2 * US,
                name=COMPUTE_KERNELS[0] if straddle_graph is None else ("", ""),
                worker_range=idx,
                graph=straddle_graph or (0, 0),
            )
        if name in NCCL_KERNELS:  # collectives on their own stream, overlapping compute
            for j in range(kernels // 2, kernels, max(1, kernels // 4)):
                s = starts[j] + int(durations[j]) // 3
                self.op(
                    "kernel",
                    pid,
                    gpu,
                    s,
                    s + int(durations[j]),
                    stream=NCCL_STREAM,
                    call_start=starts[j] - 5 * US,
                    name=NCCL_KERNELS[name],
                    worker_range=idx,
                )
        self._results_out(pid, gpu, w_end, idx, tail.get(name))

    def _batch_in(self, pid: int, gpu: int, t: int, idx: int) -> int:
        """H2D copy of the batch, then a memset of the output buffer; return where they end."""
        self.op(
            "memcpy",
            pid,
            gpu,
            t + 15 * US,
            t + 65 * US,
            stream=COPY_STREAM,
            call_start=t,
            nbytes=8 << 20,
            copy_kind=COPY_KIND_H2D,
            worker_range=idx,
        )
        t += 70 * US
        self.op(
            "memset",
            pid,
            gpu,
            t + 10 * US,
            t + 14 * US,
            call_start=t,
            nbytes=1 << 20,
            worker_range=idx,
        )
        return t + 20 * US

    def _compute(
        self,
        pid: int,
        gpu: int,
        t: int,
        body_end: int,
        k: int,
        idx: int,
        kernel_kind: KernelKind,
        gap_rounding: Callable[[float], int],
    ) -> tuple[list[int], list[int], np.ndarray]:
        """``k`` compute kernels filling [t, body_end); return their starts, ends, durations."""
        weights = self.rng.uniform(0.5, 1.5, size=k)
        span = body_end - t
        # each kernel starts 6 µs after its launch call; where k launches do not fit the range
        # at that pace, the latency shrinks to half the range's share per kernel (never a kernel
        # that ends before it starts)
        latency = 6 * US if span >= k * 6 * US else max(span // (2 * k), 0)
        usable = max(span - k * latency, 0)
        durations = (weights / weights.sum() * usable * 0.8).astype(np.int64)
        gap = gap_rounding(usable * 0.2 / k)
        cursor = t
        starts, ends = [], []
        for i in range(k):
            s = cursor + latency
            e = s + int(durations[i])
            starts.append(s)
            ends.append(e)
            kind, graph = kernel_kind(i)
            self.op(
                kind,
                pid,
                gpu,
                s,
                e,
                call_start=cursor,
                name=COMPUTE_KERNELS[i % len(COMPUTE_KERNELS)] if kind == "kernel" else ("", ""),
                worker_range=idx,
                graph=graph,
            )
            cursor = e + gap
        return starts, ends, durations

    def _results_out(
        self, pid: int, gpu: int, w_end: int, idx: int, copy: tuple[int, int, int] | None
    ) -> None:
        """The range's closing copy (``copy``: bytes, copyKind, duration), then the D2H."""
        if copy is not None:
            nbytes, copy_kind, length = copy
            s = w_end - 140 * US
            self.op(
                "memcpy",
                pid,
                gpu,
                s,
                s + length,
                stream=COPY_STREAM,
                call_start=s - 8 * US,
                nbytes=nbytes,
                copy_kind=copy_kind,
                worker_range=idx,
            )
        s = w_end - 60 * US
        self.op(
            "memcpy",
            pid,
            gpu,
            s,
            s + 40 * US,
            stream=COPY_STREAM,
            call_start=s - 8 * US,
            nbytes=1 << 20,
            copy_kind=COPY_KIND_D2H,
            worker_range=idx,
        )
