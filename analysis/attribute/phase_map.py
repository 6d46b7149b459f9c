"""Which NVTX ranges are phases, and under which name.

The default map knows VeRL's trainer phase names, its workers' stage labels (VeRL 0.9.1's own
nsys profiler) and older method names, and the subphases nvtx_phases emits;
every range in the :data:`nvtx_phases.naming.DOMAIN` domain is a phase. A user TOML file extends
or renames::

    # phases.toml
    step_names = ["step", "train_step"]   # ranges that span one training step
    domains = ["my_domain"]               # every range in these NVTX domains is a phase
    phases = ["rollout_chunk"]            # more range names that are phases
    use_defaults = true                   # keep VeRL's names (default true)

    [rename]                              # range name = phase name it counts as
    rollout = "gen"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.errors import PhaseMapError
from nvtx_phases.naming import (
    DOMAIN,
    STEP,
    SUBPHASES,
    VERL_PROFILER_ROLES,
    VERL_TRAINER_PHASES,
    VERL_WORKER_PHASES,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class PhaseMap:
    """Names and domains that make a range a phase, and renames to canonical phase names."""

    names: frozenset[str]
    domains: frozenset[str]
    step_names: frozenset[str]
    rename: tuple[tuple[str, str], ...] = ()
    all_ranges: bool = False

    def is_phase(self, name: pl.Expr, domain: pl.Expr) -> pl.Expr:
        """Boolean expression: the range counts as a phase."""
        if self.all_ranges:
            return pl.lit(True)
        known = self.names | self.step_names | {old for old, _ in self.rename}
        return name.is_in(list(known)) | domain.is_in(list(self.domains))

    def canonical(self, name: pl.Expr) -> pl.Expr:
        """The phase name a range counts as (its own name unless renamed)."""
        if not self.rename:
            return name
        return name.replace(dict(self.rename))

    def is_step(self, canonical: pl.Expr) -> pl.Expr:
        """Boolean expression: the (canonical) name marks a training step."""
        return canonical.is_in(list(self.step_names))

    def with_all_ranges(self) -> PhaseMap:
        """The same map, but every NVTX range counts as a phase."""
        return PhaseMap(self.names, self.domains, self.step_names, self.rename, all_ranges=True)


def default_phase_map() -> PhaseMap:
    """VeRL's trainer and worker phases, nvtx_phases subphases, and the nvtx_phases domain.

    VeRL 0.9.1's own stage labels (``actor_compute_log_prob``, ``actor_update``, …) are phases
    under their own names, not renamed to the method names (``compute_log_prob``,
    ``update_actor``): the label says which model ran (``actor_compute_log_prob`` also computes
    the reference log-probs when the reference lives in the actor, e.g. with LoRA, so it is not
    always ``old_log_prob`` work), and with nvtx_phases's VeRL hooks installed too both ranges
    enclose the same call, which then reads ``actor_update/update_actor`` rather than an
    ambiguous ``update_actor/update_actor``. A ``[rename]`` table merges them where wanted.
    """
    return PhaseMap(
        names=frozenset(
            (*VERL_TRAINER_PHASES, *VERL_PROFILER_ROLES, *VERL_WORKER_PHASES, *SUBPHASES)
        ),
        domains=frozenset({DOMAIN}),
        step_names=frozenset({STEP}),
    )


def load_phase_map(path: str | Path) -> PhaseMap:
    """The default map extended (or replaced, with ``use_defaults = false``) by a TOML file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PhaseMapError(f"{path}: phase map file not found") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PhaseMapError(f"{path}: not valid TOML ({exc})") from exc
    known = {"step_names", "domains", "phases", "use_defaults", "rename"}
    unknown = sorted(set(data) - known)
    if unknown:
        msg = f"{path}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}"
        raise PhaseMapError(msg)

    def str_list(key: str) -> list[str]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise PhaseMapError(f"{path}: '{key}' must be a list of strings")
        return value

    rename = data.get("rename", {})
    if not isinstance(rename, dict) or not all(isinstance(v, str) for v in rename.values()):
        raise PhaseMapError(f"{path}: [rename] must map range names to phase names (strings)")
    use_defaults = data.get("use_defaults", True)
    if not isinstance(use_defaults, bool):
        raise PhaseMapError(f"{path}: 'use_defaults' must be true or false")
    base = default_phase_map() if use_defaults else PhaseMap(frozenset(), frozenset(), frozenset())
    step_names = set(str_list("step_names")) or set(base.step_names) or {STEP}
    return PhaseMap(
        names=base.names | set(str_list("phases")) | set(rename.values()),
        domains=base.domains | set(str_list("domains")),
        step_names=frozenset(step_names | (set(base.step_names) if use_defaults else set())),
        rename=tuple(sorted(rename.items())),
    )
