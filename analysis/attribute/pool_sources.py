"""Where a run's GPU pools come from: the user's patterns, the processes' marks, or inference.

Each source names, per pool, processes and GPUs (:class:`Claimed`);
:func:`analysis.attribute.pools.resolve_pools` then adds the GPUs each pool's processes ran on,
merges pools that share one, and places what is left.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from nvtx_phases.naming import DOMAIN, POOL_MARK_PATTERN

from ..errors import InputError
from ..intervals import overlaps_earlier, union_blocks, window_at
from ..model import PROJECTION, WINDOW
from ..normalize.devices import normalize_uuid

_PID_PATTERN = re.compile(r"^pid:(\d+)$")


@dataclass
class Claimed:
    """Processes and GPUs named per pool, before the pools' own operations add their GPUs."""

    processes: dict[str, set[tuple[str, int]]]
    gpus: dict[str, set[str]]

    def __bool__(self) -> bool:
        return bool(self.processes or self.gpus)


def given_pools(
    given: Mapping[str, Sequence[str]],
    phases: pl.DataFrame,
    process_devices: pl.DataFrame,
    process_names: pl.DataFrame,
) -> Claimed:
    """The user's pools: the processes and GPUs each one's patterns match (each in one pool)."""
    processes = pl.concat(
        [
            phases.select("trace", "pid"),
            process_devices.select("trace", "pid"),
            process_names.select("trace", "pid"),
        ]
    ).unique()
    named = processes.join(process_names.unique(["trace", "pid"]), on=["trace", "pid"], how="left")
    run_gpus = sorted(set(process_devices["device"].to_list()))
    claimed = Claimed({}, {})
    owner_of_process: dict[tuple[str, int], str] = {}
    owner_of_gpu: dict[str, str] = {}
    for pool, patterns in given.items():
        mine_p: set[tuple[str, int]] = set()
        mine_g: set[str] = set()
        for pattern in patterns:
            hit = False
            pid_only = _PID_PATTERN.match(pattern)
            for trace, pid, name in named.select("trace", "pid", "process_name").rows():
                texts = [trace] + ([name] if name else [])
                if (pid_only and int(pid_only.group(1)) == pid) or (
                    not pid_only and any(fnmatch.fnmatchcase(t, pattern) for t in texts)
                ):
                    mine_p.add((trace, pid))
                    hit = True
            for gpu in run_gpus:
                if not pid_only and fnmatch.fnmatchcase(gpu, pattern):
                    mine_g.add(gpu)
                    hit = True
            if not hit:
                raise InputError(
                    f"--pool {pool}: {pattern!r} matches no file, process or GPU of the run "
                    f"(files: {', '.join(sorted(set(named['trace'].to_list()))[:6])}; GPUs: "
                    f"{', '.join(run_gpus[:4]) or 'none'})"
                )
        for proc in mine_p:
            if owner_of_process.setdefault(proc, pool) != pool:
                raise InputError(
                    f"process {proc[0]} pid {proc[1]} is in pools {owner_of_process[proc]} and "
                    f"{pool}: a process belongs to one pool"
                )
        for gpu in mine_g:
            if owner_of_gpu.setdefault(gpu, pool) != pool:
                raise InputError(f"GPU {gpu} is in pools {owner_of_gpu[gpu]} and {pool}")
        claimed.processes[pool] = mine_p
        claimed.gpus[pool] = mine_g
    return claimed


def marked_pools(marks: pl.DataFrame) -> tuple[Claimed, list[str]]:
    """Pools from the processes' pool marks (:data:`nvtx_phases.naming.POOL_MARK_PATTERN`)."""
    found = (
        marks.filter(pl.col("domain").is_in([DOMAIN, ""]))
        .with_columns(
            pl.col("text").str.extract(POOL_MARK_PATTERN, 1).alias("role"),
            pl.col("text").str.extract(POOL_MARK_PATTERN, 2).alias("gpus"),
        )
        .filter(pl.col("role").is_not_null())
        .sort("trace", "pid", "ts_ns")
    )
    claimed = Claimed({}, {})
    warnings: list[str] = []
    for (trace, pid), rows in found.group_by("trace", "pid", maintain_order=True):
        roles = list(dict.fromkeys(rows["role"].to_list()))
        role = roles[0]
        if len(roles) > 1:
            warnings.append(
                f"{trace} pid {pid} marks pool roles {', '.join(roles)}: counted in {role} "
                "(its first mark)"
            )
        claimed.processes.setdefault(role, set()).add((str(trace), int(pid)))
        gpus = (
            pl.Series(rows.filter(pl.col("role") == role)["gpus"].drop_nulls().str.split(","))
            .explode()
            .drop_nulls()
        )
        uuids = pl.select(normalize_uuid(pl.lit(gpus))).to_series().drop_nulls().to_list()
        claimed.gpus.setdefault(role, set()).update(uuids)
    return claimed, warnings


def inferred_pools(
    phases: pl.DataFrame, process_devices: pl.DataFrame
) -> tuple[Claimed, list[str]]:
    """Pools of driver processes whose phases overlap, each with the workers it launched.

    A driver's non-step window ranges are the candidates; each worker range (top-level
    projection range) votes, by its duration, for the candidate that started last before it and
    is still open then; a process joins the driver with most votes. Nothing when driver
    phases of different processes never overlap (one driver, or drivers one after another).
    """
    window = phases.filter(
        (pl.col("attribution") == WINDOW) & ~pl.col("is_step") & (pl.col("level") >= 0)
    )
    drivers = window.select("trace", "pid").unique()
    if drivers.height < 2 or not _processes_overlap(window):
        return Claimed({}, {}), []
    candidates = (
        window.select(
            "trace",
            "pid",
            pl.col("start_ns").alias("step_start_ns"),
            pl.col("end_ns").alias("step_end_ns"),
        )
        .with_row_index("candidate")
        .with_columns(pl.col("candidate").cast(pl.Int64).alias("step"))
        .sort("step_start_ns", "candidate")
    )
    workers = phases.filter((pl.col("attribution") == PROJECTION) & (pl.col("level") == 0))
    if workers.is_empty():
        return Claimed({}, {}), []
    hit = window_at(candidates, workers["start_ns"])
    votes = (
        workers.select(
            pl.col("trace").alias("w_trace"),
            pl.col("pid").alias("w_pid"),
            (pl.col("end_ns") - pl.col("start_ns")).alias("weight"),
        )
        .with_columns(hit.alias("candidate"))
        .drop_nulls("candidate")
        .join(
            candidates.select("candidate", "trace", "pid").with_columns(
                pl.col("candidate").cast(pl.Int64)
            ),
            on="candidate",
        )
        .group_by("w_trace", "w_pid", "trace", "pid")
        .agg(pl.col("weight").sum() + pl.len())  # zero-length ranges still vote
        .sort(
            ["w_trace", "w_pid", "weight", "trace", "pid"],
            descending=[False, False, True, False, False],
        )
        .unique(["w_trace", "w_pid"], keep="first", maintain_order=True)
    )
    names = {(str(t), int(p)): f"{t}:{p}" for t, p in drivers.sort("trace", "pid").rows()}
    claimed = Claimed({name: {key} for key, name in names.items()}, {})
    for w_trace, w_pid, trace, pid, _ in votes.rows():
        claimed.processes[names[(str(trace), int(pid))]].add((str(w_trace), int(w_pid)))
    assigned = ", ".join(
        f"{pool}: {len(procs)} process(es)" for pool, procs in sorted(claimed.processes.items())
    )
    return claimed, [
        "driver phases of several processes overlap in time (asynchronous RL: a trainer and a "
        f"rollouter): GPU pools inferred from which processes each one drives ({assigned}); "
        "each driver phase is attributed its own pool's GPUs only. Give them with --pool "
        "NAME=PATTERN or mark them with nvtx_phases.pools.mark_pool if this is wrong"
    ]


def _processes_overlap(window: pl.DataFrame) -> bool:
    """Whether ranges of two different processes share some time.

    Each process's ranges merge into disjoint blocks, so a block that starts before an earlier
    block has ended overlaps a block of another process.
    """
    spans = window.filter(pl.col("end_ns") > pl.col("start_ns"))
    if spans.height < 2:
        return False
    blocks = union_blocks(spans, ["trace", "pid"]).sort("start_ns", "end_ns")
    return bool(blocks.select(overlaps_earlier().any()).item())
