"""How to analyze a run: :class:`AnalyzeOptions`, built once and passed whole.

The CLI builds it from its flags, a caller of the Python API from keywords
(``analyze(paths, jobs=4)`` or ``analyze(paths, options)``); every stage reads what it needs from
the one object, and ``summary.json``'s provenance records it (:meth:`AnalyzeOptions.provenance`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .attribute.phase_map import PhaseMap, default_phase_map, load_phase_map
from .errors import InputError

#: How the exports are read: one after the other, in a process pool, or as Ray tasks.
Engine = Literal["serial", "process", "ray"]
ENGINES: tuple[Engine, ...] = ("serial", "process", "ray")

#: Most GPU operations held in memory at once; bigger runs are spilled to Parquet.
DEFAULT_CHUNK_OPS = 2_000_000


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions:
    """Every option of an analysis (the result never depends on ``jobs``/``engine``/``chunk_ops``).

    ``phase_map``: a :class:`PhaseMap`, a TOML file (``--phase-map``) or None for the default
    map; ``all_ranges``: every NVTX range is a phase; ``strip_args``: PyTorch's argument
    suffixes cut off range names. ``power_files``: NVML sampler files or power logs (nvidia-smi
    CSV, ``dcgmi dmon``, Zeus; :mod:`analysis.energy.power_logs`) (None: the sampler files found
    beside the traces; ``()``: none); ``idle_power_w``: a GPU's idle power, for idle energy.
    ``jobs``/``engine``: read the exports in parallel; ``chunk_ops``/``spill_dir``: the memory
    budget and where bigger runs spill. ``force_combine``: analyze files that do not look like
    one run together anyway. ``steps``: keep only these steps (``--steps``, e.g. ``"2:"``).
    ``pools``: the run's GPU pools, name → patterns (``--pool``; before the phase map's
    ``[pools]``; None: from the processes' pool marks, else inferred; see
    :mod:`analysis.attribute.pools`).
    """

    phase_map: PhaseMap | str | Path | None = None
    all_ranges: bool = False
    strip_args: bool = False
    power_files: Sequence[str | Path] | None = None
    idle_power_w: float | None = None
    jobs: int = 1
    engine: Engine = "process"
    chunk_ops: int = DEFAULT_CHUNK_OPS
    spill_dir: str | Path | None = None
    force_combine: bool = False
    steps: str | None = None
    pools: Mapping[str, Sequence[str]] | None = None
    #: the map read once, here, so a bad file fails before a long analysis
    _resolved: PhaseMap = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_types()
        if self.jobs < 1:
            raise InputError(f"jobs: {self.jobs} is not a number of processes (1 or more)")
        if self.chunk_ops < 1:
            raise InputError(f"chunk_ops: {self.chunk_ops} must be 1 or more")
        if self.idle_power_w is not None and self.idle_power_w < 0:
            raise InputError(f"idle_power_w: {self.idle_power_w} W is negative")
        if self.steps:
            from .step_spec import parse_steps

            parse_steps(self.steps)  # a bad spec fails before a long analysis
        if self.power_files is not None:
            files = self.power_files
            files = [files] if isinstance(files, str | Path) else files  # one file, not its letters
            object.__setattr__(self, "power_files", tuple(Path(p) for p in files))
        if self.pools is not None:
            object.__setattr__(
                self, "pools", {str(k): tuple(v) for k, v in self.pools.items()} or None
            )
        pmap = self.phase_map
        if isinstance(pmap, str | Path):
            pmap = load_phase_map(pmap)
        elif pmap is not None and not isinstance(pmap, PhaseMap):
            raise InputError(
                f"phase_map: expected a PhaseMap or a TOML file's path, got {type(pmap).__name__}"
            )
        pmap = pmap or default_phase_map()
        pmap = pmap.with_strip_args() if self.strip_args else pmap
        object.__setattr__(self, "_resolved", pmap.with_all_ranges() if self.all_ranges else pmap)

    def _check_types(self) -> None:
        """Values of the wrong type are one clear line (the CLI's parser checks its own)."""

        def bad(name: str, expected: str) -> InputError:
            value = getattr(self, name)
            return InputError(
                f"{name}: expected {expected}, got {value!r} ({type(value).__name__})"
            )

        for name in ("all_ranges", "strip_args", "force_combine"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "True or False")
        for name in ("jobs", "chunk_ops"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(name, "an integer")
        power = self.idle_power_w
        if power is not None and (not isinstance(power, int | float) or isinstance(power, bool)):
            raise bad("idle_power_w", "watts (a number) or None")
        if self.engine not in ENGINES:
            raise bad("engine", " or ".join(repr(e) for e in ENGINES))
        if self.steps is not None and not isinstance(self.steps, str):
            raise bad("steps", 'a --steps text such as "2:" or "1,3"')
        if self.spill_dir is not None and not isinstance(self.spill_dir, str | Path):
            raise bad("spill_dir", "a folder's path or None")
        pools = self.pools
        if pools is not None and not (
            isinstance(pools, Mapping)
            and all(
                isinstance(v, Sequence)
                and not isinstance(v, str)
                and all(isinstance(p, str) for p in v)
                for v in pools.values()
            )
        ):
            raise bad(
                "pools",
                'a mapping of pool names to lists of patterns, e.g. {"rollout": ["rollout_*"]}',
            )
        files = self.power_files
        if files is not None and not (
            isinstance(files, str | Path)
            or (isinstance(files, Sequence) and all(isinstance(f, str | Path) for f in files))
        ):
            raise bad("power_files", "a file's path, a list of them, or None")

    @property
    def resolved_phase_map(self) -> PhaseMap:
        """The phase map the analysis uses: the file or map given, with the two flags applied."""
        return self._resolved

    @property
    def resolved_pools(self) -> dict[str, tuple[str, ...]] | None:
        """The pools given: ``pools``, else the phase map's ``[pools]``, else None."""
        if self.pools:
            return dict(self.pools)  # type: ignore[arg-type]
        return dict(self._resolved.pools) or None

    @property
    def phase_map_file(self) -> Path | None:
        """The TOML file the phase map came from, when it came from one."""
        return Path(self.phase_map) if isinstance(self.phase_map, str | Path) else None

    def replace(self, **changes: Any) -> AnalyzeOptions:
        """A copy with ``changes`` (unknown names: one clear :class:`InputError`)."""
        return options_from(self, changes)

    def provenance(self) -> dict[str, Any]:
        """The options as JSON values, as ``summary.json`` records them.

        ``phase_map``: None for the default map (with or without the flags), the file's absolute
        path when it came from one, else ``"custom"``.
        """
        default = dataclasses.replace(
            self._resolved, all_ranges=False, strip_args=False
        ) == dataclasses.replace(default_phase_map(), strip_args=False)
        map_file = self.phase_map_file
        return {
            "phase_map": str(map_file.absolute())
            if map_file is not None
            else (None if default else "custom"),
            "all_ranges": self._resolved.all_ranges,
            "strip_args": self._resolved.strip_args,
            "power_files": None
            if self.power_files is None
            else [str(Path(p).absolute()) for p in self.power_files],
            "idle_power_w": self.idle_power_w,
            "jobs": self.jobs,
            "engine": self.engine,
            "chunk_ops": self.chunk_ops,
            "spill_dir": None if self.spill_dir is None else str(Path(self.spill_dir).absolute()),
            "force_combine": self.force_combine,
            "steps": self.steps,
            # only when given: the provenance of a run without pools is as it was
            **({"pools": {k: list(v) for k, v in self.pools.items()}} if self.pools else {}),
        }


OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(AnalyzeOptions) if f.init)


def options_from(options: AnalyzeOptions | None, changes: Mapping[str, Any]) -> AnalyzeOptions:
    """``options`` (default: all defaults) with ``changes``; an unknown name is an InputError."""
    if options is not None and not isinstance(options, AnalyzeOptions):
        raise InputError(
            f"options: expected an AnalyzeOptions, got {type(options).__name__} "
            "(pass options as keywords, or AnalyzeOptions(**them))"
        )
    unknown = sorted(set(changes) - OPTION_NAMES)
    if unknown:
        raise InputError(
            f"unknown option(s) {', '.join(unknown)}; expected {', '.join(sorted(OPTION_NAMES))}"
        )
    if options is None:
        return AnalyzeOptions(**changes)
    return dataclasses.replace(options, **changes) if changes else options
