"""The driver process: VeRL-shaped steps marked with ``nvtx_phases``, the work done by two workers.

``python -m checks.gpu_capture.driver --out DIR --device cuda|cpu --sizes JSON --pipes DIR``. Like VeRL's trainer, the driver launches no GPU work: it marks ``step >
gen, reward, old_log_prob, ref, adv, update_actor, update_weights`` and asks the rollout and
the trainer process (both on device 0) for each phase's work, computing ``reward`` and ``adv``
itself on its CPU, talking to them over FIFOs (``--pipes``): the device step starts the
driver and each worker as siblings, each under its own ``nsys profile`` (one report per process,
as VeRL's Ray workers are profiled; a worker started by a profiled driver would also land in
the driver's report). On a GPU the driver also runs the NVML sampler and reads the GPU's energy counter at both
ends of every phase (``counter_reads.json``, the reads ``checks.gpu_check`` compares against).
Writes ``events.json`` (workers' hellos and timed replies), ``ranges.jsonl`` (the JSONL
recorder, every process), ``power_samples.json`` and ``counter_reads.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from checks.gpu_capture.model import (
    DRIVER_PHASES,
    EVENTS_FILE,
    PHASE_WORK,
    RANGES_FILE,
    READS_FILE,
    ROLES,
    SAMPLES_FILE,
    Sizes,
)
from nvtx_phases.marking import phase, record_to, step


def nsys_prefix(nsys: str, mode: str, output: Path) -> list[str]:
    """``nsys profile`` of one process: CUDA and NVTX, no CPU sampling (it hangs 2022.4)."""
    return [
        nsys, "profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
        f"--cuda-graph-trace={mode}", "--export=none", "--force-overwrite=true", "-o", str(output),
    ]  # fmt: skip


class Worker:
    """The driver's end of one worker's FIFOs (the worker process is the device step's)."""

    def __init__(self, role: str, pipes: Path) -> None:
        self.role = role
        # the worker opens <role>.in first, then <role>.out: the same order, or both block
        self.commands: IO[str] = (pipes / f"{role}.in").open("w")
        self.answers: IO[str] = (pipes / f"{role}.out").open()
        self.hello = self.receive()

    def send(self, op: str, step_index: int) -> None:
        """Ask for one command (answered by :meth:`receive`)."""
        self.commands.write(json.dumps({"op": op, "step": step_index}) + "\n")
        self.commands.flush()

    def receive(self) -> dict[str, Any]:
        """The worker's next JSON line."""
        line = self.answers.readline()
        if not line:
            raise RuntimeError(f"the {self.role} worker closed its pipe (it exited)")
        return dict(json.loads(line))

    def close(self) -> None:
        """End the worker: it stops when its command pipe closes."""
        self.commands.close()
        self.answers.close()


class CounterReads:
    """The GPU's total-energy counter read by this process at phase ends (none on CPU)."""

    def __init__(self, cuda: bool) -> None:
        self.rows: list[dict[str, Any]] = []
        self.nv: Any = None
        if cuda:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)

    def read(self, step_index: int, name: str, at: str) -> None:
        """One read, stamped with ``time.monotonic_ns()`` before and after (the sampler's)."""
        if self.nv is None:
            return
        before = time.monotonic_ns()
        value = self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        after = time.monotonic_ns()
        self.rows.append(
            {"step": step_index, "phase": name, "at": at, "mono_ns_before": before,
             "mono_ns_after": after, "energy_mj": int(value)}
        )  # fmt: skip


def cpu_work(seconds: float) -> None:
    """The driver's own CPU work (reward scoring, advantages): hashing for ``seconds``."""
    deadline, digest = time.monotonic() + seconds, b"reward"
    while time.monotonic() < deadline:
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()


def run_phase(workers: dict[str, Worker], name: str, k: int, sizes: Sizes) -> list[dict[str, Any]]:
    """One phase's work: every worker's command sent first (they overlap), then the replies."""
    work = PHASE_WORK[name]
    for role, op in work:
        workers[role].send(op, k)
    if name in ("reward", "adv"):
        cpu_work(sizes.reward_s if name == "reward" else sizes.adv_s)
    return [{"role": role, "phase": name, **workers[role].receive()} for role, _ in work]


def step_loop(workers: dict[str, Worker], sizes: Sizes, reads: CounterReads) -> list[dict]:
    """A warm-up round (step 0: marked ``warmup``, not a step), then steps 1…N."""
    replies: list[dict[str, Any]] = []
    with phase("warmup", step=0):
        for name in DRIVER_PHASES:
            run_phase(workers, name, 0, Sizes.dry())
    for k in range(1, sizes.steps + 1):  # 1-based: nvtx < 0.2.9 carries step 0 as "none"
        with step(k):
            for name in DRIVER_PHASES:
                with phase(name):
                    reads.read(k, name, "start")
                    replies += run_phase(workers, name, k, sizes)
                    reads.read(k, name, "end")
    return replies


def run(out: Path, device: str, sizes: Sizes, pipes: Path, interval_s: float) -> None:
    """The whole run; every file written even when a worker fails midway."""
    out.mkdir(parents=True, exist_ok=True)
    cuda = device == "cuda"
    sampler = None
    if cuda:
        from nvtx_phases.power import PowerSampler

        sampler = PowerSampler(interval_s=interval_s).start()
    reads = CounterReads(cuda)
    events: dict[str, Any] = {"device": device, "sizes": asdict(sizes), "driver_pid": os.getpid()}
    workers: dict[str, Worker] = {}
    try:
        with record_to(out / RANGES_FILE):
            for role in ROLES:
                workers[role] = Worker(role, pipes)
            events["hellos"] = {role: w.hello for role, w in workers.items()}
            events["replies"] = step_loop(workers, sizes, reads)
    finally:
        for w in workers.values():
            w.close()
        if sampler is not None:
            sampler.stop()
            (out / SAMPLES_FILE).write_text(json.dumps(sampler.samples))
        (out / READS_FILE).write_text(json.dumps(reads.rows))
        (out / EVENTS_FILE).write_text(json.dumps(events, indent=1))


def main(argv: list[str] | None = None) -> None:
    """Command line of the driver (the device step starts it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--sizes", default="{}", help="JSON of checks.gpu_capture.model.Sizes")
    p.add_argument("--pipes", required=True, type=Path, help="folder of the workers' FIFOs")
    p.add_argument("--interval-s", type=float, default=0.02)
    a = p.parse_args(argv)
    run(a.out, a.device, Sizes(**json.loads(a.sizes)), a.pipes, a.interval_s)


if __name__ == "__main__":
    main()
