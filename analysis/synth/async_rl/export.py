"""One nsys 2022.4-schema export per process of the asynchronous capture.

Every process sees its GPU (if any) as deviceId 0 on its own session clock, as under Ray
(:mod:`analysis.synth.ray.export` writes the GPU row). NVTX is what the capture side records:
each process creates domain ``nvtx_phases`` and marks its pool there once at start-up
(:func:`nvtx_phases.pools.mark_pool`: ``nvtx.mark`` with a registered string and the default
color, blue, which nsys stores as 255); the controllers' ranges are nvtx_phases's hooks' (domain
``nvtx_phases``, registered strings, the phase's color, the step or version as int64 payload);
the trainer controller also holds the samples marks and the power sampler's clock marks; the
trainer workers mark their worker ranges with plain text in the default domain.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nvtx_phases.naming import DOMAIN, phase_color, pool_mark_text, samples_mark_text
from nvtx_phases.power import clock_mark_text

from ..export import (
    NVTX_DOMAIN_CREATE,
    NVTX_MARK,
    NVTX_RANGE,
    gtid,
    write_export,
)
from ..ray.export import process_spec
from ..timeline import GpuOp
from .config import TRAINER_CONTROLLER_PID, AsyncProcess
from .model import AsyncBuilder

#: ``nvtx.mark``'s default color ("blue") as nsys stores it.
MARK_COLOR = 0x000000FF
#: domainId of ``nvtx_phases``: the only domain any of these processes creates.
PHASES_DOMAIN = 1


def pool_mark(b: AsyncBuilder, proc: AsyncProcess) -> str:
    """The text of ``proc``'s pool mark: its role, and the UUID of the GPU it drives."""
    gpus = () if proc.gpu is None else (f"GPU-{b.uuids[proc.gpu]}",)
    return pool_mark_text(proc.pool, gpus)


def traced_ops(b: AsyncBuilder) -> list[GpuOp]:
    """The GPU operations the exports hold: all, or none of the rollout servers' if untraced."""
    if not b.cfg.untraced_rollout:
        return b.ops
    return [o for o in b.ops if o.gpu not in b.rollout_gpus]


def nvtx_rows(b: AsyncBuilder, proc: AsyncProcess) -> Callable[[Callable[[str], int]], list[tuple]]:
    """The NVTX_EVENTS rows of ``proc``'s export, as :func:`write_export` takes them."""

    def rows(string_id: Callable[[str], int]) -> list[tuple]:
        shift, main = proc.shift_ns, gtid(proc.pid, proc.pid)
        t_mark = b.pool_marks[proc.pid]

        def mark(t: int, text: str) -> tuple:
            return (
                t - shift,
                None,
                NVTX_MARK,
                MARK_COLOR,
                None,
                main,
                string_id(text),
                PHASES_DOMAIN,
                None,
            )

        out = [
            (
                t_mark - 5_000 - shift,
                None,
                NVTX_DOMAIN_CREATE,
                None,
                DOMAIN,
                main,
                None,
                PHASES_DOMAIN,
                None,
            ),
            mark(t_mark, pool_mark(b, proc)),
        ]
        if proc.pid == TRAINER_CONTROLLER_PID:
            if b.cfg.power:
                out += [
                    mark(t, clock_mark_text(mono, wall))
                    for t, mono, wall in b.clock_marks()
                    if t > t_mark
                ]
            out += [mark(m.t, samples_mark_text(m.step, m.version, m.versions)) for m in b.samples]
        for r in b.driver:
            if r.pid == proc.pid:
                out.append(
                    (
                        r.start - shift,
                        r.end - shift,
                        NVTX_RANGE,
                        phase_color(r.name),
                        None,
                        main,
                        string_id(r.name),
                        PHASES_DOMAIN,
                        r.payload,
                    )
                )
        for r in b.workers:
            if r.pid == proc.pid:
                out.append(
                    (
                        r.start - shift,
                        r.end - shift,
                        NVTX_RANGE,
                        None,
                        r.name,
                        gtid(r.pid, r.tid),
                        None,
                        0,
                        None,
                    )
                )
        return sorted(out, key=lambda row: row[0])

    return rows


def write_process(path: Path, b: AsyncBuilder, proc: AsyncProcess) -> None:
    """Write one process's export: its own session clock, its GPU as deviceId 0."""
    ops = traced_ops(b)
    spec = process_spec(
        proc,
        host=b.cfg.host,
        duration_ns=b.duration,
        uuids=b.uuids,
        launch_kinds=(o.kind for o in ops if o.pid == proc.pid),
        generated_by=f"nvtx-phases analysis.synth.async_rl (asynchronous capture, {proc.role})",
    )
    write_export(path, spec, b, clock_marks=False, nvtx=nvtx_rows(b, proc), ops=ops)
