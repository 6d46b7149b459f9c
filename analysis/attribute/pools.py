"""GPU pools: which GPUs a driver-side (window) phase is attributed, in disaggregated runs.

Synchronous, colocated RL (VeRL's hybrid engine) runs every phase on every GPU: one pool, and the
window scheme gives a driver phase the work of every GPU while it is open. Asynchronous RL
(VeRL's ``fully_async_policy``, ``one_step_off_policy``; NeMo-RL async GRPO; AReaL, slime) runs a
trainer and a rollouter on separate GPU pools whose phases overlap in time; there a window phase
of the trainer is attributed the trainer pool's GPUs only, and the rollouter's phases the
rollout pool's. A pool is a named set of physical GPUs and the processes (trace, pid) that
belong to it. Where pools come from, the first that applies:

1. **user** (``--pool NAME=PATTERN,…``, ``[pools]`` in the phase map): a pattern is an fnmatch
   glob over a file's label (its stem), a process name, a GPU's device name, or ``pid:N``;
2. **marks** (:func:`nvtx_phases.pools.mark_pool`): processes that mark role ``R`` form pool
   ``R``; its GPUs are the ones their marks name plus the ones their operations ran on;
3. **inferred** (no marks, no pools given, and the phase ranges of two or more driver processes
   overlap in time): a process with GPU operations joins the driver process whose phase range
   started last before each of its own worker ranges (a vote weighted by the worker ranges'
   time); said in a warning.

Pools that share a GPU are merged (a GPU's time is counted once), with a warning. GPUs no pool
claims go to the one pool that has none, when exactly one has none (the rollout servers of an
inference engine that marks nothing); otherwise they, and driver processes of no pool, form the
pool :data:`UNPOOLED`, with a warning. A run without pools is one pool of every GPU
(:meth:`Pools.whole`), and its outputs are those of a colocated run, unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from ..errors import InputError
from ..model import WINDOW
from .pool_sources import Claimed, given_pools, inferred_pools, marked_pools

#: the pool of the driver processes and GPUs that no pool names (only when pools exist)
UNPOOLED = "unpooled"
#: the one pool of a run without pools (never written: such a run's outputs have no pools)
WHOLE = "all"
#: columns of :attr:`Pools.members`
MEMBER_SCHEMA = {"trace": pl.String, "pid": pl.Int64, "pool": pl.String}
#: columns of the per-process GPU use that :func:`resolve_pools` takes
PROCESS_DEVICE_SCHEMA = {"trace": pl.String, "pid": pl.Int64, "device": pl.String}
#: columns of the process names :func:`resolve_pools` takes
PROCESS_NAME_SCHEMA = {"trace": pl.String, "pid": pl.Int64, "process_name": pl.String}
_PID_PATTERN = re.compile(r"^pid:(\d+)$")


@dataclass(frozen=True)
class Pools:
    """The run's GPU pools: each pool's GPUs, and the pool of each process that has one."""

    #: ``trace, pid, pool``: every process a pool names (empty for :meth:`whole`)
    members: pl.DataFrame
    #: pool → its GPUs (sorted), pools in name order
    devices: dict[str, tuple[str, ...]]
    #: "whole" (no pools: one pool of every GPU), "user", "marks" or "inferred"
    source: str
    warnings: tuple[str, ...] = field(default=())

    @classmethod
    def whole(cls, devices: Sequence[str]) -> Pools:
        """One pool of every GPU: a colocated run, or a run that gives no pools."""
        return cls(pl.DataFrame(schema=MEMBER_SCHEMA), {WHOLE: tuple(sorted(devices))}, "whole")

    @property
    def split(self) -> bool:
        """Whether the run has pools (else every output is that of a one-pool run)."""
        return self.source != "whole"

    def pool_of(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (with ``trace, pid``) with ``pool``: its process's (``UNPOOLED`` if none)."""
        if not self.split:
            return frame.with_columns(pl.lit(WHOLE).alias("pool"))
        return frame.join(self.members, on=["trace", "pid"], how="left").with_columns(
            pl.col("pool").fill_null(UNPOOLED)
        )

    def table(self) -> pl.DataFrame:
        """One row per pool: ``pool, n_devices, devices`` (comma-separated), ``processes``."""
        rows = []
        for name, devices in self.devices.items():
            mine = self.members.filter(pl.col("pool") == name).sort("trace", "pid")
            rows.append(
                {
                    "pool": name,
                    "source": self.source,
                    "n_devices": len(devices),
                    "devices": ",".join(devices),
                    "processes": ",".join(
                        f"{t}:{p}" for t, p in mine.select("trace", "pid").rows()
                    ),
                }
            )
        return pl.DataFrame(
            rows,
            schema={
                "pool": pl.String,
                "source": pl.String,
                "n_devices": pl.Int64,
                "devices": pl.String,
                "processes": pl.String,
            },
        )


def parse_pool_option(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--pool NAME=PATTERN[,PATTERN…]`` values → pool name → patterns (``InputError`` if bad)."""
    pools: dict[str, tuple[str, ...]] = {}
    for value in values:
        name, sep, patterns = value.partition("=")
        name = name.strip()
        listed = tuple(p.strip() for p in patterns.split(",") if p.strip())
        if not sep or not name or not listed:
            raise InputError(
                f"--pool {value!r}: expected NAME=PATTERN[,PATTERN…] (a file's stem, a process "
                "name or a GPU, as globs, or pid:N), e.g. --pool rollout='rollout_*'"
            )
        if name in pools:
            raise InputError(f"--pool {name} is given twice: list its patterns in one --pool")
        pools[name] = listed
    return pools


def resolve_pools(
    phases: pl.DataFrame,
    *,
    marks: pl.DataFrame,
    process_devices: pl.DataFrame,
    process_names: pl.DataFrame,
    devices: Sequence[str],
    given: Mapping[str, Sequence[str]] | None = None,
) -> Pools:
    """The run's pools (see the module docstring).

    ``phases``: phase ranges with ``trace, pid, start_ns, end_ns, level, is_step, attribution``;
    ``marks``: NVTX marks (``trace, pid, text, domain``); ``process_devices``: ``trace, pid,
    device`` for every GPU a process's operations ran on; ``process_names``: ``trace, pid,
    process_name``; ``devices``: the run's GPUs; ``given``: pool → patterns (the user's).
    """
    warnings: list[str] = []
    if given:
        claimed, source = given_pools(given, phases, process_devices, process_names), "user"
    else:
        claimed, warnings = marked_pools(marks)
        source = "marks"
        if not claimed:
            claimed, warnings = inferred_pools(phases, process_devices)
            source = "inferred"
        if not claimed:
            return Pools.whole(devices)
    members, pool_devices, merge_warnings = _with_devices(claimed, process_devices)
    members, pool_devices, rest_warnings = _rest(members, pool_devices, phases, devices)
    # one named pool (the rest unpooled) says nothing about which GPU does what: colocated
    if len(set(pool_devices) - {UNPOOLED}) < 2 and source != "user":
        return Pools.whole(devices)
    return Pools(
        members.sort("pool", "trace", "pid"),
        {k: tuple(sorted(pool_devices[k])) for k in sorted(pool_devices)},
        source,
        tuple([*warnings, *merge_warnings, *rest_warnings]),
    )


# --- GPUs, merges and what is left -----------------------------------------------------------


def _with_devices(
    claimed: Claimed, process_devices: pl.DataFrame
) -> tuple[pl.DataFrame, dict[str, set[str]], list[str]]:
    """Members and each pool's GPUs (named, and used by its processes); merge pools sharing one."""
    pool_of: dict[tuple[str, int], str] = {}
    for pool, procs in claimed.processes.items():
        for proc in procs:
            pool_of[proc] = pool
    gpus: dict[str, set[str]] = {p: set(g) for p, g in claimed.gpus.items()}
    for pool in claimed.processes:
        gpus.setdefault(pool, set())
    for trace, pid, device in process_devices.select("trace", "pid", "device").unique().rows():
        owner_pool = pool_of.get((str(trace), int(pid)))
        if owner_pool is not None:
            gpus[owner_pool].add(str(device))
    # pools sharing a GPU are one pool: union-find over pools through their GPUs
    parent = {p: p for p in gpus}

    def root(p: str) -> str:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    owner: dict[str, str] = {}
    for pool in sorted(gpus):
        for gpu in sorted(gpus[pool]):
            if gpu in owner:
                parent[root(pool)] = root(owner[gpu])
            else:
                owner[gpu] = pool
    groups: dict[str, list[str]] = {}
    for pool in sorted(gpus):
        groups.setdefault(root(pool), []).append(pool)
    warnings = []
    rename: dict[str, str] = {}
    merged: dict[str, set[str]] = {}
    for pools in groups.values():
        name = "+".join(sorted(pools))
        merged[name] = set().union(*(gpus[p] for p in pools))
        for p in pools:
            rename[p] = name
        if len(pools) > 1:
            warnings.append(
                f"pools {', '.join(sorted(pools))} share GPU(s) "
                f"{', '.join(sorted(set.intersection(*(gpus[p] for p in pools))) or '(through others)')}: "
                f"counted as one pool {name} (a GPU's time is counted once)"
            )
    members = pl.DataFrame(
        [(t, p, rename[pool]) for (t, p), pool in sorted(pool_of.items())],
        schema=MEMBER_SCHEMA,
        orient="row",
    )
    return members, merged, warnings


def _rest(
    members: pl.DataFrame,
    pool_devices: dict[str, set[str]],
    phases: pl.DataFrame,
    run_devices: Sequence[str],
) -> tuple[pl.DataFrame, dict[str, set[str]], list[str]]:
    """GPUs no pool claims, and driver processes of no pool (see the module docstring)."""
    claimed = set().union(*pool_devices.values()) if pool_devices else set()
    left = sorted(set(run_devices) - claimed)
    drivers = (
        phases.filter(pl.col("attribution") == WINDOW)
        .select("trace", "pid")
        .unique()
        .join(members, on=["trace", "pid"], how="anti")
        .sort("trace", "pid")
    )
    warnings: list[str] = []
    empty = [p for p, d in pool_devices.items() if not d]
    if left and len(empty) == 1:
        pool_devices[empty[0]] = set(left)
        warnings.append(
            f"pool {empty[0]} names no GPU and {len(left)} GPU(s) belong to no pool "
            f"({', '.join(left[:4])}{', …' if len(left) > 4 else ''}): they are counted in "
            f"{empty[0]} (their processes mark no pool, as an inference server's do not)"
        )
        left = []
    if left or drivers.height:
        pool_devices[UNPOOLED] = set(left)
        members = pl.concat(
            [members, drivers.with_columns(pl.lit(UNPOOLED).alias("pool")).cast(MEMBER_SCHEMA)]  # type: ignore[arg-type]
        )
        said = []
        if left:
            said.append(
                f"{len(left)} GPU(s) ({', '.join(left[:4])}{', …' if len(left) > 4 else ''})"
            )
        if drivers.height:
            shown = ", ".join(f"{t} pid {p}" for t, p in drivers.head(4).rows())
            said.append(f"the phases of {drivers.height} process(es) ({shown})")
        warnings.append(
            f"{' and '.join(said)} belong to no pool: counted in pool {UNPOOLED}"
            + (" (its phases are attributed no GPU)" if not left else "")
        )
    return members, pool_devices, warnings
