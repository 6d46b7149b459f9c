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
    strip_args = false                    # true: "aten::mm, op_id = 12" reads "aten::mm"

    [rename]                              # range name = phase name it counts as
    rollout = "gen"

    [[rule]]                              # names matched by a pattern, in order, after the
    match = "aten::*"                     # exact names above: fnmatch glob (case-sensitive)
    [[rule]]
    regex = "^compute_.*_log_prob$"       # Python regular expression, searched (re.search)
    phase = "log_prob"                    # the phase it counts as (default: its own name)

    [pools]                               # GPU pools of an asynchronous run (as --pool)
    rollout = ["rollout_*", "pid:3001"]   # file stems, process names, GPUs (globs), pid:N

A range is a phase when its name is an exact name (``phases``, ``step_names``, a ``[rename]``
key), its domain is listed, or the first ``[[rule]]`` its name matches says so; exact names keep
their own (or renamed) phase name, rules apply to the other ranges only. ``strip_args`` (or
``--strip-args``) first cuts a name at its first ``", <identifier> = "`` (PyTorch's
``emit_nvtx`` ranges: ``aten::mm, seq = 3, op_id = 12, sizes = [[2, 3]]`` → ``aten::mm``), so that
``--all-ranges`` groups an operator's calls in one row; a name that would become empty is kept.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from nvtx_phases.naming import (
    ASYNC_PHASES,
    ASYNC_RENAMES,
    DOMAIN,
    STEP,
    SUBPHASES,
    VERL_PROFILER_ROLES,
    VERL_TRAINER_PHASES,
    VERL_WORKER_PHASES,
    VERSION,
)

from ..errors import PhaseMapError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


#: ``strip_args``: everything from the first ``", <identifier> = "`` on is a PyTorch argument list
STRIP_ARGS_PATTERN = r"(?s)^(.+?), [A-Za-z_][A-Za-z0-9_]* = .*$"


@dataclass(frozen=True)
class Rule:
    """A ``[[rule]]``: range names a glob (``match``) or regular expression (``regex``) selects."""

    kind: Literal["glob", "regex"]
    pattern: str
    #: the phase name matching ranges count as; None: their own name
    phase: str | None = None
    compiled: re.Pattern[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text = fnmatch.translate(self.pattern) if self.kind == "glob" else self.pattern
        object.__setattr__(self, "compiled", re.compile(text))

    def target(self, name: str) -> str | None:
        """The phase ``name`` counts as under this rule, or None when it does not match."""
        hit = self.compiled.match(name) if self.kind == "glob" else self.compiled.search(name)
        return None if hit is None else (self.phase or name)


@dataclass(frozen=True)
class PhaseMap:
    """Names and domains that make a range a phase, and renames to canonical phase names."""

    names: frozenset[str]
    domains: frozenset[str]
    step_names: frozenset[str]
    rename: tuple[tuple[str, str], ...] = ()
    all_ranges: bool = False
    #: pattern rules, tried in order on names that are not exact names
    rules: tuple[Rule, ...] = ()
    #: cut PyTorch's ``, key = value`` argument suffixes off range names (:meth:`name`)
    strip_args: bool = False
    #: GPU pools given in the map's ``[pools]`` (name → patterns; :mod:`analysis.attribute.pools`)
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def name(self, name: pl.Expr) -> pl.Expr:
        """The range's name as phases see it: with ``strip_args``, its argument suffix cut."""
        if not self.strip_args:
            return name
        return name.str.replace(STRIP_ARGS_PATTERN, "${1}")

    def is_phase(self, name: pl.Expr, domain: pl.Expr) -> pl.Expr:
        """Boolean expression: the range counts as a phase (``name`` as :meth:`name` gives it)."""
        if self.all_ranges:
            return pl.lit(True)
        hit = name.is_in(list(self._exact())) | domain.is_in(list(self.domains))
        return hit | self._rule_target(name).is_not_null() if self.rules else hit

    def canonical(self, name: pl.Expr) -> pl.Expr:
        """The phase name a range counts as: renamed, else its first rule's phase, else its own."""
        renamed = name.replace(dict(self.rename)) if self.rename else name
        if not self.rules:
            return renamed
        exact = name.is_in(list(self._exact()))
        return pl.when(exact).then(renamed).otherwise(pl.coalesce(self._rule_target(name), name))

    def _exact(self) -> frozenset[str]:
        return self.names | self.step_names | {old for old, _ in self.rename}

    def _rule_target(self, name: pl.Expr) -> pl.Expr:
        """The phase each name counts as under the first rule it matches (null: none matches)."""
        return name.map_batches(self._targets, return_dtype=pl.String, is_elementwise=True)

    def _targets(self, names: pl.Series) -> pl.Series:
        exact = self._exact()
        found: dict[str, str] = {}
        for value in names.drop_nulls().unique().to_list():
            if value in exact:
                continue
            target = next((t for r in self.rules if (t := r.target(value)) is not None), None)
            if target is not None:
                found[value] = target
        return names.cast(pl.String).replace_strict(found, default=None, return_dtype=pl.String)

    def is_step(self, canonical: pl.Expr) -> pl.Expr:
        """Boolean expression: the (canonical) name marks a training step."""
        return canonical.is_in(list(self.step_names))

    def with_all_ranges(self) -> PhaseMap:
        """The same map, but every NVTX range counts as a phase."""
        return dataclasses.replace(self, all_ranges=True)

    def with_strip_args(self) -> PhaseMap:
        """The same map, with PyTorch's argument suffixes cut off range names (:meth:`name`)."""
        return dataclasses.replace(self, strip_args=True)


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
            (
                *VERL_TRAINER_PHASES,
                *VERL_PROFILER_ROLES,
                *VERL_WORKER_PHASES,
                *SUBPHASES,
                *ASYNC_PHASES,
                VERSION,
            )
        ),
        domains=frozenset({DOMAIN}),
        step_names=frozenset({STEP}),
        # VeRL's async timer names hold a "/", which would split a phase path
        rename=tuple(sorted(ASYNC_RENAMES.items())),
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
    known = {
        "step_names",
        "domains",
        "phases",
        "use_defaults",
        "rename",
        "rule",
        "strip_args",
        "pools",
    }
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
    strip_args = data.get("strip_args", False)
    for key, value in (("use_defaults", use_defaults), ("strip_args", strip_args)):
        if not isinstance(value, bool):
            raise PhaseMapError(f"{path}: '{key}' must be true or false")
    base = default_phase_map() if use_defaults else PhaseMap(frozenset(), frozenset(), frozenset())
    step_names = set(str_list("step_names")) or set(base.step_names) or {STEP}
    return PhaseMap(
        names=base.names | set(str_list("phases")) | set(rename.values()),
        domains=base.domains | set(str_list("domains")),
        step_names=frozenset(step_names | (set(base.step_names) if use_defaults else set())),
        rename=tuple(sorted((dict(base.rename) | rename).items())),
        rules=_rules(path, data.get("rule", [])),
        strip_args=strip_args,
        pools=_pools(path, data.get("pools", {})),
    )


def _pools(path: Path, entries: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``[pools]``: pool name = a pattern or a list of them (as ``--pool NAME=PATTERN,…``)."""
    if not isinstance(entries, dict):
        raise PhaseMapError(f"{path}: [pools] must map pool names to patterns")
    pools = []
    for name, value in entries.items():
        patterns = [value] if isinstance(value, str) else value
        if (
            not isinstance(patterns, list)
            or not patterns
            or not all(isinstance(p, str) and p for p in patterns)
        ):
            raise PhaseMapError(
                f"{path}: [pools] {name} must be a pattern or a list of patterns (a file's "
                "stem, a process name or a GPU, as globs, or pid:N)"
            )
        pools.append((str(name), tuple(patterns)))
    return tuple(pools)


def _rules(path: Path, entries: Any) -> tuple[Rule, ...]:
    """The ``[[rule]]`` tables: each ``match`` (glob) or ``regex``, and optionally ``phase``."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise PhaseMapError(f"{path}: 'rule' must be [[rule]] tables")
    rules = []
    for number, entry in enumerate(entries, start=1):
        where = f"{path}: [[rule]] #{number}"
        unknown = sorted(set(entry) - {"match", "regex", "phase"})
        if unknown:
            raise PhaseMapError(f"{where}: unknown key(s) {', '.join(unknown)}")
        patterns = [k for k in ("match", "regex") if k in entry]
        if len(patterns) != 1:
            raise PhaseMapError(f"{where}: needs exactly one of 'match' (glob) or 'regex'")
        kind = patterns[0]
        pattern, phase = entry[kind], entry.get("phase")
        if not isinstance(pattern, str) or not pattern:
            raise PhaseMapError(f"{where}: '{kind}' must be a non-empty string")
        if phase is not None and (not isinstance(phase, str) or not phase):
            raise PhaseMapError(f"{where}: 'phase' must be a non-empty string")
        try:
            rules.append(Rule("glob" if kind == "match" else "regex", pattern, phase))
        except re.error as exc:
            raise PhaseMapError(f"{where}: regex {pattern!r} is not valid ({exc})") from None
    return tuple(rules)
