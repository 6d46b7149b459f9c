"""A worker process: the rollout (CUDA-graph decoding) or the trainer (forward/backward/optimizer).

``python -m checks.gpu_capture.worker ROLE --device cuda|cpu --sizes JSON --pipes DIR``. The
driver sends one JSON command per line on the FIFO ``DIR/ROLE.in`` (``{"op": "generate_sequences", "step": 1}``); the worker marks
the command with an ``nvtx_phases`` range of that name (projection ranges, like VeRL's worker
methods), runs it, synchronizes, and answers one JSON line on ``DIR/ROLE.out`` with its timings: CUDA
events around the command's GPU work (and around each graph replay), on the GPU's own clock
and independent of nsys. On CPU the timings are ``time.perf_counter_ns`` and say so.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from checks.gpu_capture.model import Sizes
from nvtx_phases.marking import phase


class Clock:
    """Timings of GPU work: CUDA events on a GPU, the CPU's clock otherwise."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.kind = "cuda_event" if cuda else "cpu_perf_counter"

    def mark(self) -> Any:
        """A timestamp: a recorded CUDA event, or ``perf_counter_ns`` now."""
        if not self.cuda:
            return time.perf_counter_ns()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ns(self, a: Any, b: Any) -> int:
        """Nanoseconds between two marks (call after a synchronize)."""
        if not self.cuda:
            return int(b - a)
        return round(a.elapsed_time(b) * 1e6)

    def sync(self) -> None:
        """Wait for the GPU (nothing on CPU)."""
        if self.cuda:
            self.torch.cuda.synchronize()


class Rollout:
    """A decoder of ``layers`` tanh(x W) layers; one decode step captured as a CUDA graph."""

    def __init__(self, torch: Any, clock: Clock, s: Sizes) -> None:
        self.torch, self.clock, self.s = torch, clock, s
        dev = "cuda" if clock.cuda else "cpu"
        dtype = torch.bfloat16 if clock.cuda else torch.float32
        g = torch.Generator(device="cpu").manual_seed(1)
        w = [torch.randn(s.hidden, s.hidden, generator=g) / s.hidden**0.5 for _ in range(s.layers)]
        self.weights = [x.to(dev, dtype) for x in w]
        self.staged = [x.clone() for x in self.weights]  # "new" weights to load in weight_sync
        self.x = torch.randn(s.batch, s.hidden, generator=g).to(dev, dtype)
        self.graph = self._capture() if clock.cuda else None

    def _decode(self) -> None:
        h = self.x
        for w in self.weights:
            h = self.torch.tanh(h @ w)
        self.x.copy_(h)

    def _capture(self) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph (cuBLAS workspaces)
            for _ in range(3):
                self._decode()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._decode()
        torch.cuda.synchronize()
        return graph

    def generate_sequences(self) -> dict[str, Any]:
        """``tokens`` decode steps: one graph replay each, each timed."""
        marks = [self.clock.mark()]
        for _ in range(self.s.tokens):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._decode()
            marks.append(self.clock.mark())
        self.clock.sync()
        per = [self.clock.elapsed_ns(a, b) for a, b in itertools.pairwise(marks)]
        return {"elapsed_ns": self.clock.elapsed_ns(marks[0], marks[-1]), "replays_ns": per}

    def weight_sync(self) -> dict[str, Any]:
        """Load the staged weights (copies into the graph's own weight tensors)."""
        a = self.clock.mark()
        for w, new in zip(self.weights, self.staged, strict=True):
            w.copy_(new)
        b = self.clock.mark()
        self.clock.sync()
        return {"elapsed_ns": self.clock.elapsed_ns(a, b)}


class Trainer:
    """An MLP policy and a frozen reference copy; AdamW updates over micro-batches."""

    def __init__(self, torch: Any, clock: Clock, s: Sizes) -> None:
        self.torch, self.clock, self.s = torch, clock, s
        dev = "cuda" if clock.cuda else "cpu"
        dtype = torch.bfloat16 if clock.cuda else torch.float32
        torch.manual_seed(2)
        nn = torch.nn
        layers = [nn.Linear(s.hidden, s.hidden), nn.GELU(), nn.Linear(s.hidden, s.hidden)]
        self.actor = nn.Sequential(*layers).to(dev, dtype)
        self.ref = copy.deepcopy(self.actor)
        self.opt = torch.optim.AdamW(self.actor.parameters(), lr=1e-5)
        self.batch = torch.randn(s.micro_batch, s.hidden).to(dev, dtype)
        self.packed = torch.empty(sum(p.numel() for p in self.actor.parameters()), device=dev)

    def _timed(self, work: Callable[[], None]) -> dict[str, Any]:
        a = self.clock.mark()
        work()
        b = self.clock.mark()
        self.clock.sync()
        return {"elapsed_ns": self.clock.elapsed_ns(a, b)}

    def _forward(self, model: Any) -> None:
        with self.torch.no_grad():
            for _ in range(self.s.micro_batches):
                self.torch.log_softmax(model(self.batch).float(), dim=-1)

    def compute_log_prob(self) -> dict[str, Any]:
        """Forward passes of the actor, no gradients."""
        return self._timed(lambda: self._forward(self.actor))

    def compute_ref_log_prob(self) -> dict[str, Any]:
        """Forward passes of the reference model."""
        return self._timed(lambda: self._forward(self.ref))

    def update_actor(self) -> dict[str, Any]:
        """Forward, backward and an optimizer step per micro-batch."""

        def work() -> None:
            for _ in range(self.s.micro_batches):
                loss = self.actor(self.batch).float().pow(2).mean()
                loss.backward()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)

        return self._timed(work)

    def weight_sync(self) -> dict[str, Any]:
        """Pack the actor's weights into one flat buffer (what a weight sync sends)."""

        def work() -> None:
            flat = [p.detach().reshape(-1).float() for p in self.actor.parameters()]
            self.torch.cat(flat, out=self.packed)

        return self._timed(work)


class PythonWorker:
    """Without torch (a dry run in an environment that lacks it): SHA-256 rounds as the work."""

    def __init__(self, sizes: Sizes) -> None:
        self.rounds = 200 * sizes.micro_batches

    def __getattr__(self, op: str) -> Callable[[], dict[str, Any]]:
        def work() -> dict[str, Any]:
            start, digest = time.perf_counter_ns(), op.encode()
            for _ in range(self.rounds):
                digest = hashlib.sha256(digest).digest()
            return {"elapsed_ns": time.perf_counter_ns() - start}

        return work


def build(role: str, device: str, sizes: Sizes) -> tuple[Any, dict[str, Any]]:
    """The role's worker and its hello message (pid, clock kind, versions, GPU)."""
    try:
        import torch
    except ImportError:
        if device == "cuda":
            raise
        hello = {"role": role, "pid": os.getpid(), "clock": "cpu_perf_counter", "torch": None}
        return PythonWorker(sizes), hello
    cuda = device == "cuda"
    clock = Clock(torch, cuda)
    worker: Any = (Rollout if role == "rollout" else Trainer)(torch, clock, sizes)
    hello = {"role": role, "pid": os.getpid(), "clock": clock.kind, "torch": torch.__version__}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        raw = getattr(props, "uuid", None)  # torch's _CUuuid: str() and .bytes spell it
        raw_bytes = getattr(raw, "bytes", None)
        hello |= {
            "device_name": props.name,
            "uuid": str(raw),
            "uuid_hex": bytes(raw_bytes).hex() if raw_bytes is not None else None,
        }
    return worker, hello


def serve(role: str, device: str, sizes: Sizes, pipes: Path) -> None:
    """Open the role's pipes, build its model, say hello, run commands until the driver closes.

    ``pipes/<role>.in`` is opened first, then ``<role>.out``: the order the driver opens them.
    """
    with (pipes / f"{role}.in").open() as commands, (pipes / f"{role}.out").open("w") as out:
        worker, hello = build(role, device, sizes)
        reply(out, hello)
        for line in commands:
            cmd = json.loads(line)
            with phase(cmd["op"], step=cmd["step"] or None):
                result = getattr(worker, cmd["op"])()
            reply(out, {"op": cmd["op"], "step": cmd["step"], **result})


def reply(out: IO[str], message: dict[str, Any]) -> None:
    """One JSON line to the driver."""
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> None:
    """Command line of a worker (started by the driver)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=("rollout", "trainer"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--sizes", required=True, help="JSON of checks.gpu_capture.model.Sizes")
    p.add_argument("--pipes", required=True, type=Path, help="folder of the FIFOs to the driver")
    a = p.parse_args(argv)
    serve(a.role, a.device, Sizes(**json.loads(a.sizes)), a.pipes)


if __name__ == "__main__":
    main()
