"""Ground truth of the asynchronous capture, by brute force over the exported operations.

Independent of :mod:`analysis`: numpy clipping per range, a sort-merge union per GPU
(:mod:`analysis.synth.truth`'s helpers) and a walk over the elementary segments of each pool's
timeline for the innermost range and idle by cause, following the issue-28 conventions literally.
"""

from __future__ import annotations

import numpy as np

from ..timeline import Range
from ..truth import op_arrays, phase_metrics
from .config import TRAINER_CONTROLLER_PID
from .export import traced_ops
from .model import AsyncBuilder

ASYNC_NOTES = (
    "Times are ns on the run clock: the trainer controller's session clock, the earliest "
    "session. A file's timestamps are run time minus its clock_offset_ns.",
    "Pools: 'trainer' = the trainer controller and the trainer workers, with the workers' GPUs; "
    "'rollout' = the rollouter and the rollout servers, with the servers' GPUs. device = "
    "'GPU-' + TARGET_INFO_GPU.uuid; every process's export calls its GPU deviceId 0.",
    "window_phases: one row per controller range. Its pool's operations (on the pool's GPUs only) "
    "clipped to the range's interval; a parent's figures include its children's time. "
    "gpu_busy_ns = sum over the pool's GPUs of the union of those parts; n_devices = |pool GPUs|; "
    "idle_ns = wall_ns * n_devices - gpu_busy_ns; step = the trainer step (pool trainer, axis "
    "'step') or the parameter version (pool rollout, axis 'version'), the range's payload.",
    "captured = false: the pool has GPUs but none of its operations lies inside the range while "
    "its GPUs drew power above idle (power_active) or a worker process of the pool (not the "
    "controller that owns the range) had a range open in it, or the pool's GPUs show no "
    "operation anywhere in the exports; the row's GPU figures are then null (not 0).",
    "pools: total_gpu_ns = sum of (end - start) of the operations on the pool's GPUs in the "
    "exports; attributed_gpu_ns = their time inside the pool's window ranges (each instant to "
    "the innermost range, so inside the top-level step/version ranges); unattributed_gpu_ns = "
    "the rest (warm-up, between trainer steps, after the last version). All three null (and "
    "captured false) for a pool none of whose operations is in the exports (untraced_rollout).",
    "idle_causes: over the pool's span (first start to last end of its window ranges), each "
    "elementary segment is idle for length * n_devices - busy and takes the cause of its "
    "innermost range (deepest level, equal depth: later start; none: no_phase, step null); "
    "causes of a pool add up to span_idle_ns. idle_ns is null where a segment's innermost range "
    "is not captured.",
    "staleness: per trainer step, lag = version - sample version over its samples (from its "
    "samples mark); mean and share_lag_ge_1 are weighted by sample counts.",
    "worker_phases (projection): operations launched inside the worker range, counted whole.",
)
#: Phase name → idle cause (anything else: ``other``); ``gen`` of the trainer is starvation.
_CAUSES = {
    "wait_for_enough_samples": "starvation",
    "param_sync": "refit",
    "update_weights": "refit",
    "weight_sync": "refit",
    "partial_pause": "partial_rollout_pause",
    "staleness_wait": "generation_limit",
    "testing": "validation",
    "validate": "validation",
}
_POOL_TIMES = ("total_gpu_ns", "attributed_gpu_ns", "unattributed_gpu_ns")
_GPU_KEYS = (
    "gpu_busy_ns",
    "idle_ns",
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "n_kernels",
)


def idle_cause(pool: str, phase: str | None) -> str:
    """The idle cause of an instant whose innermost range (of a ``pool`` process) is ``phase``."""
    if phase is None:
        return "no_phase"
    if phase == "gen" and pool == "trainer":
        return "starvation"  # the trainer's gen takes samples from the queue: it waits
    return _CAUSES.get(phase, "other")


def pool_of(b: AsyncBuilder, r: Range) -> str:
    """The pool of a controller range: the trainer's or the rollout's."""
    return "trainer" if r.pid == TRAINER_CONTROLLER_PID else "rollout"


def async_ground_truth(b: AsyncBuilder) -> dict:
    """Expected per-pool metrics of the asynchronous capture."""
    ops = traced_ops(b)
    a = op_arrays(ops)
    gpus = {"trainer": list(b.trainer_gpus), "rollout": list(b.rollout_gpus)}
    traces = {p.pid: p.file.removesuffix(".sqlite") for p in b.processes}
    rows = [_window_row(b, a, r, gpus[pool_of(b, r)], traces) for r in b.driver]
    pools = []
    causes: list[dict] = []
    for pool, pool_gpus in gpus.items():
        ranges = [r for r in b.driver if pool_of(b, r) == pool]
        mine = [w for w in rows if w["pool"] == pool]
        pool_rows, pool_causes = _pool_truth(a, pool, pool_gpus, ranges, mine)
        procs = [{"trace": traces[p.pid], "pid": p.pid} for p in b.processes if p.pool == pool]
        if not pool_rows["total_gpu_ns"]:
            # no operation of the pool was captured at all: its GPU time is unknown, not 0
            pool_rows |= dict.fromkeys(_POOL_TIMES, None)
        pools.append(
            {
                "pool": pool,
                "axis": "step" if pool == "trainer" else "version",
                "devices": [f"GPU-{b.uuids[g]}" for g in pool_gpus],
                "n_devices": len(pool_gpus),
                "processes": procs,
                "captured": pool_rows["total_gpu_ns"] is not None,
                **pool_rows,
            }
        )
        causes += pool_causes
    return {
        "pools": pools,
        "window_phases": rows,
        "idle_causes": causes,
        "staleness": _staleness(b),
        "worker_phases": _worker_phases(b, a, traces),
        "n_gpu_ops": len(ops),
        "n_gpu_ops_generated": len(b.ops),
    }


def _window_row(
    b: AsyncBuilder, a: dict[str, np.ndarray], r: Range, pool_gpus: list[int], traces: dict
) -> dict:
    """One controller range's window figures on its pool's GPUs (null where not captured)."""
    pool = pool_of(b, r)
    on_pool = np.isin(a["gpu"], pool_gpus)
    wall = r.end - r.start
    m = phase_metrics(a, r.start, r.end, on_pool, clip=True)
    n = len(pool_gpus)
    any_op = bool((on_pool & (a["start"] < r.end) & (a["end"] > r.start)).any())
    power_active = any(
        g in pool_gpus and w > 0 and s < r.end and e > r.start for g, s, e, w in b.power.activity
    )
    worker_open = any(
        w.pid != r.pid and w.pid in _pool_pids(b, pool) and w.start < r.end and w.end > r.start
        for w in b.workers
    )
    # a pool whose GPUs show no operation in the whole capture was not traced at all
    pool_traced = bool(on_pool.any())
    captured = pool_traced and (any_op or not (power_active or worker_open))
    figures = {**m, "idle_ns": wall * n - m["gpu_busy_ns"]}
    return {
        "pool": pool,
        "trace": traces[r.pid],
        "pid": r.pid,
        "axis": "step" if pool == "trainer" else "version",
        "step": r.step,
        "phase": r.name,
        "path": r.path,
        "level": r.path.count("/"),
        "start_ns": r.start,
        "end_ns": r.end,
        "wall_ns": wall,
        "n_devices": n,
        "captured": captured,
        "power_active": power_active,
        **{k: (figures[k] if captured else None) for k in _GPU_KEYS},
    }


def _pool_pids(b: AsyncBuilder, pool: str) -> set[int]:
    return {p.pid for p in b.processes if p.pool == pool}


def _pool_truth(
    a: dict[str, np.ndarray],
    pool: str,
    pool_gpus: list[int],
    ranges: list[Range],
    rows: list[dict],
) -> tuple[dict, list[dict]]:
    """A pool's conservation totals and its idle by cause, over its elementary segments."""
    on_pool = np.isin(a["gpu"], pool_gpus)
    start, end = a["start"][on_pool], a["end"][on_pool]
    gpu = a["gpu"][on_pool]
    total = int((end - start).sum())
    tops = [r for r in ranges if "/" not in r.path]
    attributed = sum(
        int(np.clip(np.minimum(end, r.end) - np.maximum(start, r.start), 0, None).sum())
        for r in tops
    )
    lo, hi = min(r.start for r in ranges), max(r.end for r in ranges)
    cuts = {lo, hi}
    cuts.update(x for r in ranges for x in (r.start, r.end))
    cuts.update(int(x) for x in np.concatenate([start, end]).tolist() if lo < x < hi)
    edges = np.array(sorted(cuts), dtype=np.int64)
    seg_s, seg_e = edges[:-1], edges[1:]
    length = seg_e - seg_s
    # busy GPUs per segment: an operation covers a whole elementary segment or none of it
    busy = np.zeros(len(seg_s), dtype=np.int64)
    for g in pool_gpus:
        gs, ge = np.sort(start[gpu == g]), np.sort(end[gpu == g])
        open_ops = np.searchsorted(gs, seg_s, side="right") - np.searchsorted(ge, seg_s, "right")
        busy += open_ops > 0
    idle = length * len(pool_gpus) - busy * length
    # innermost range per segment: deepest level, then the later start
    best = np.full(len(seg_s), -1, dtype=np.int64)
    best_key = np.full(len(seg_s), -1, dtype=np.int64)
    for i, r in enumerate(ranges):
        rank = r.path.count("/") * 10**13 + r.start  # starts lie below 10**13 ns
        inside = (seg_s >= r.start) & (seg_e <= r.end) & (rank > best_key)
        best[inside] = i
        best_key[inside] = rank
    row_of = {(w["phase"], w["step"], w["start_ns"]): w for w in rows}
    groups: dict[tuple[int | None, str], int | None] = {}
    for k in range(len(seg_s)):
        inner = ranges[best[k]] if best[k] >= 0 else None
        cause = idle_cause(pool, None if inner is None else inner.name)
        step = None if inner is None else inner.step
        known = inner is None or row_of[(inner.name, inner.step, inner.start)]["captured"]
        prev = groups.get((step, cause), 0)
        groups[(step, cause)] = None if prev is None or not known else prev + int(idle[k])
    causes = [
        {"pool": pool, "step": step, "cause": cause, "idle_ns": v}
        for (step, cause), v in sorted(
            groups.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1])
        )
    ]
    values = list(groups.values())
    span_idle = None if None in values else sum(v for v in values if v is not None)
    return {
        "total_gpu_ns": total,
        "attributed_gpu_ns": attributed,
        "unattributed_gpu_ns": total - attributed,
        "span_start_ns": lo,
        "span_end_ns": hi,
        "span_idle_ns": span_idle,
    }, causes


def _staleness(b: AsyncBuilder) -> list[dict]:
    """Per trainer step: the version lag of its samples (min, mean, max, share with lag ≥ 1)."""
    out = []
    for m in b.samples:
        lags = [(m.version - v, n) for v, n in m.versions.items()]
        count = sum(n for _, n in lags)
        out.append(
            {
                "step": m.step,
                "version": m.version,
                "versions": {str(v): n for v, n in sorted(m.versions.items())},
                "n_samples": count,
                "min": min(lag for lag, _ in lags),
                "mean": sum(lag * n for lag, n in lags) / count,
                "max": max(lag for lag, _ in lags),
                "share_lag_ge_1": sum(n for lag, n in lags if lag >= 1) / count,
            }
        )
    return out


def _worker_phases(b: AsyncBuilder, a: dict[str, np.ndarray], traces: dict) -> list[dict]:
    """Projection figures of each trainer worker range: its operations, whole."""
    out = []
    for i, r in enumerate(b.workers):
        m = phase_metrics(a, r.start, r.end, a["wr"] == i, clip=False)
        out.append(
            {
                "trace": traces[r.pid],
                "pid": r.pid,
                "step": r.step,
                "phase": r.name,
                "start_ns": r.start,
                "end_ns": r.end,
                "wall_ns": r.end - r.start,
                **m,
                "n_devices": 1,
            }
        )
    return out
