"""The measured workload: marked ``idle``, ``gen`` and ``update_actor`` phases of unlike power."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checks.gpu_check.model import PHASES, Config
from checks.gpu_check.project import phase, step


@dataclass
class Workload:
    """One batch of each kind of work, and the barrier that makes a phase's window true."""

    gen: Callable[[], None]  # memory-bound
    update: Callable[[], None]  # compute-bound
    sync: Callable[[], None]
    description: str


def python_workload() -> Workload:
    """Without torch (a dry run in a venv that lacks it): hashing as both kinds of work."""

    def burn(rounds: int) -> None:
        digest = b"nvtx-phases"
        for _ in range(rounds):
            digest = hashlib.sha256(digest).digest()

    return Workload(
        gen=lambda: burn(2000),
        update=lambda: burn(4000),
        sync=lambda: None,
        description="python (torch not installed): SHA-256 rounds for gen and update_actor",
    )


def build_workload(torch: Any, dry: bool) -> Workload:
    """Buffers and kernels: HBM-streaming elementwise ops (gen) and big bf16 matmuls (update)."""
    if torch is None:
        return python_workload()
    if dry:
        device, n, m, dtype, reps = torch.device("cpu"), 1 << 16, 128, torch.float32, 2
        sync: Callable[[], None] = lambda: None  # noqa: E731
    else:
        device, n, m, dtype, reps = torch.device("cuda", 0), 1 << 28, 8192, torch.bfloat16, 8
        sync = torch.cuda.synchronize
    x = torch.ones(n, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    c = torch.empty_like(a)

    def gen() -> None:
        for _ in range(2 * reps):  # x stays near 1: x ← 0.999 x + 0.001
            torch.mul(x, 0.999, out=y)
            torch.add(y, 0.001, out=x)

    def update() -> None:
        for _ in range(reps):
            torch.matmul(a, b, out=c)

    gib = 2 * x.numel() * x.element_size() / 2**30
    text = f"gen: mul/add over 2 × {gib / 2:.3g} GiB fp32; update_actor: {m}² {dtype} matmuls"
    return Workload(gen=gen, update=update, sync=sync, description=f"{device.type}: {text}")


def run_phase(
    name: str,
    seconds: float,
    work: Callable[[], None] | None,
    sync: Callable[[], None],
    probe: Callable[[str, float], None] | None = None,
    mark: Callable[[str], None] | None = None,
) -> None:
    """One marked phase of about ``seconds``: work in batches (or sleep), synced before it closes.

    ``probe(name, t_into_phase_s)`` is called once, a quarter second (or a quarter of the phase)
    into it, while the phase's work runs. ``mark("start")`` and ``mark("end")`` are called inside
    the phase's range, each right after a ``sync()``: at its start, before any work, and at its
    end, after the last batch finished (the workload's own counter reads).
    """
    with phase(name):
        if mark is not None:
            sync()
            mark("start")
        start = time.monotonic()
        deadline, probe_at = start + seconds, start + min(0.25, seconds / 4)
        while True:
            now = time.monotonic()
            if probe is not None and now >= probe_at:
                probe(name, now - start)
                probe = None
            if now >= deadline:
                break
            if work is None:
                time.sleep(min(deadline, probe_at if probe else deadline) - now)
            else:
                work()
                sync()  # a batch at a time: the queue never runs ahead of the phase's window
        sync()
        if mark is not None:
            mark("end")


def run_workload(
    cfg: Config,
    work: Workload,
    probe: Callable[[int, str, float], None] | None = None,
    mark: Callable[[int, str, str], None] | None = None,
) -> None:
    """Warm-up (range ``warmup``), then steps 1…N of ``idle``, ``gen``, ``update_actor``.

    ``probe(step, phase, t)``: once per phase of step 1; ``mark(step, phase, "start"/"end")``: at
    both ends of every phase (see :func:`run_phase`).
    """
    kinds = {"idle": None, "gen": work.gen, "update_actor": work.update}
    with phase("warmup"):
        deadline = time.monotonic() + cfg.warmup_s
        while time.monotonic() < deadline:
            work.gen()
            work.update()
            work.sync()
    for index in range(1, cfg.steps + 1):  # 1-based: nvtx < 0.2.9 carries step 0 as "none"
        with step(index):
            for name in PHASES:
                hook = None
                if probe is not None and index == 1:
                    hook = lambda n, t, i=index: probe(i, n, t)  # noqa: E731
                ends = None
                if mark is not None:
                    ends = lambda at, i=index, n=name: mark(i, n, at)  # noqa: E731
                run_phase(name, cfg.phase_s, kinds[name], work.sync, hook, ends)
    time.sleep(cfg.tail_s)  # unmarked idle: samples past the last edge (and a late averaged one)
