"""Phase tables from VeRL's own logs alone: no trace needed (pure functions, files only read).

VeRL 0.9.1's trainer logs one metrics dict per step (``Tracking.log``). Its console logger
(``verl.utils.logger.LocalLogger``) prints ``step:3 - key:value - key:value …``, each value as
``pprint.pformat`` writes it: ``41.28733241604641``, ``1024``, ``1e-05``, ``nan``, ``True``, and
numpy 2 scalars as ``np.float64(3.5)``/``np.int64(0)``. Under Ray the line comes behind a
coloured ``(TaskRunner pid=1234)`` prefix; ANSI codes, carriage returns (progress bars) and
Ray's ``[repeated 2x across cluster]`` suffix are removed. Its file logger (``FileLogger``)
writes JSON lines ``{"step": 3, "data": {...}}`` with orjson, which writes NaN as ``null``; a
flat ``{"step": 3, "key": value, …}`` object is read too. Text is only matched and
``json.loads``-ed, never evaluated.

Timers are ``timing_s/<stage>`` (VeRL 0.1: ``timing/<stage>``, printed ``f"{k}:{v:.3f}"``, and no
``step`` timer; where a step has both prefixes, ``timing_s/`` wins). A step without a ``step`` timer
gets the sum of its phase timers as its time (:data:`SUMMED`): the time between stages is then not
seen. Phases are the one-level stages; not phases, and kept in the steps table,
are the stages VeRL 0.9.1 times outside ``step`` (``testing``, ``start_profile``,
``stop_profile``), the rollout worker's timers nested inside ``gen`` in older releases
(``generate_sequences``, ``reshard``) and every deeper key (``timing_s/agent_loop/...``).
Validation metrics (``val-core/``, ``val-aux/``, ``val/``) are dropped.

Several files are run segments in the order given: a step logged again (a resumed run redoing
the steps after its last checkpoint) keeps only the values of the last file that logged it; within
one file, the last value of each key wins. NaN becomes null.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl

from ..aggregate.shares import share_over_steps
from ..errors import InputError, WorkloadInputError

#: timer key prefixes, newest first (``timing_s/`` wins over ``timing/`` for a step)
TIMER_PREFIXES = ("timing_s/", "timing/")
# fmt: off
#: the trainer's stages inside ``step``, in VeRL 0.9.1's execution order (ray_trainer.fit)
STAGE_ORDER = (
    "gen", "gen_max", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
    "update_actor", "save_checkpoint", "update_weights", "dump_rollout_generations",
)
# fmt: on
#: the whole step's timer (``timing_s/step``)
STEP = "step"
#: one-level timers that are not phases of the step: outside it, or nested inside ``gen``
NOT_PHASES = frozenset(
    {"testing", "start_profile", "stop_profile", "generate_sequences", "reshard"}
)
#: validation metrics, logged with the training step's number but not about it
VALIDATION_PREFIXES = ("val-core/", "val-aux/", "val/")
#: the part of the step no phase timer covers
OTHER = "other (not timed)"
#: column groups of the steps table, in this order (then every other key)
STEP_GROUPS = ("timing_per_token_ms/", "perf/", "response_length/")

#: one row per metric value read: file (its index), record (line), step, key, place in the record
LOG_SCHEMA = {
    "segment": pl.Int64,
    "record": pl.Int64,
    "step": pl.Int64,
    "key": pl.String,
    "position": pl.Int64,
    "value": pl.Float64,
}
#: the columns a ``phase_times.csv`` must have (``whatif`` reads it); the step's time is phase ``step``
PHASE_TIMES_SCHEMA = {"step": pl.Int64, "phase": pl.String, "seconds": pl.Float64}
#: what ``logs`` writes: also ``source``, the logged key of each value, or :data:`SUMMED`
PHASE_TIMES_COLUMNS = {**PHASE_TIMES_SCHEMA, "source": pl.String}
#: ``source`` of a step's time that no step timer gave: the sum of its phase timers
SUMMED = "sum of stage timers"

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_STEP_START = re.compile(r"(?<![\w/.@-])step:(\d+) - ")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
_NUMPY_SCALAR = re.compile(r"np\.(?:float|int|uint)\d*\((.*)\)")
_NUMBER = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)")
_KEY = re.compile(r"[^\s:]+")

_Pairs = list[tuple[str, float | None]]


def parse_value(text: str) -> tuple[bool, float | None]:
    """``(is_number, value)`` of a value as ``pprint.pformat`` prints it; NaN → None."""
    text = text.strip()
    scalar = _NUMPY_SCALAR.fullmatch(text)
    if scalar:
        text = scalar.group(1).strip()
    if text in ("True", "False"):
        return True, float(text == "True")
    if not _NUMBER.fullmatch(text):
        return False, None
    value = float(text)
    return True, None if value != value else value


def parse_console_line(line: str) -> tuple[int, _Pairs] | None:
    """``(step, [(key, value), …])`` of a console-logger line, or None for any other line."""
    line = _RAY_REPEATED.sub("", _ANSI.sub("", line).rstrip())
    start = _STEP_START.search(line)
    if start is None:
        return None
    pairs: _Pairs = []
    for item in line[start.end() :].split(" - "):
        key, colon, text = item.rpartition(":")
        is_number, value = parse_value(text)
        if colon and is_number and _KEY.fullmatch(key):
            pairs.append((key, value))
    return int(start.group(1)), pairs


def parse_json_line(line: str) -> tuple[int, _Pairs] | None:
    """``(step, pairs)`` of a file-logger line (``{"step": N, "data": {…}}`` or flat), or None."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    data = record["data"] if isinstance(record.get("data"), dict) else record
    pairs: _Pairs = []
    for key, value in data.items():
        if key != "step" and (value is None or isinstance(value, int | float)):
            # orjson writes NaN as null; NaN becomes null here too
            pairs.append((str(key), None if value is None or value != value else float(value)))
    return step, pairs


def _lines(path: Path) -> Iterator[str]:
    # universal newlines: a progress bar's "\r" ends a line, as it does on a terminal
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            yield from handle
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def read_log(path: str | Path, segment: int = 0) -> pl.DataFrame:
    """Every metric of every step record in one VeRL log (:data:`LOG_SCHEMA`)."""
    path = Path(path)
    rows: list[tuple[int, int, int, str, int, float | None]] = []
    for number, line in enumerate(_lines(path)):
        parsed = parse_json_line(line) or parse_console_line(line)
        if parsed is not None:
            step, pairs = parsed
            rows += [(segment, number, step, key, i, value) for i, (key, value) in enumerate(pairs)]
    return pl.DataFrame(rows, schema=LOG_SCHEMA, orient="row")


def _is_validation() -> pl.Expr:
    return pl.any_horizontal(pl.col("key").str.starts_with(p) for p in VALIDATION_PREFIXES)


def _timers(values: pl.DataFrame) -> pl.DataFrame:
    """The phase timers among ``values``: ``phase`` and ``prefix_rank`` (0: ``timing_s/``)."""
    frames = [
        values.filter(pl.col("key").str.starts_with(prefix)).with_columns(
            pl.col("key").str.strip_prefix(prefix).alias("phase"),
            pl.lit(rank, pl.Int64).alias("prefix_rank"),
        )
        for rank, prefix in enumerate(TIMER_PREFIXES)
    ]
    return pl.concat(frames).filter(
        ~pl.col("phase").str.contains("/", literal=True)
        & ~pl.col("phase").is_in(list(NOT_PHASES))
        & (pl.col("phase") != "")
    )


def read_logs(paths: Sequence[str | Path]) -> pl.DataFrame:
    """The metrics of several logs (run segments, in order), validation dropped.

    Raises :class:`WorkloadInputError` naming the first file without step timers.
    """
    frames = []
    for segment, path in enumerate(paths):
        frame = read_log(path, segment).filter(~_is_validation())
        if _timers(frame).is_empty():
            raise WorkloadInputError(
                f"{path}: no VeRL step timers found (expected 'timing_s/<stage>' metrics, or "
                "'timing/<stage>' from older releases, e.g. timing_s/gen, in console lines "
                "'step:N - timing_s/gen:12.3 - …' or file-logger JSON lines "
                '\'{"step": N, "data": {…}}\')'
            )
        frames.append(frame)
    return pl.concat(frames) if frames else pl.DataFrame(schema=LOG_SCHEMA)


def repeated_steps(log: pl.DataFrame) -> list[int]:
    """Steps whose timers were logged in more than one record (a resumed run, a log given twice)."""
    return sorted(
        _timers(log)
        .group_by("step")
        .agg(pl.struct("segment", "record").n_unique().alias("n"))
        .filter(pl.col("n") > 1)["step"]
        .to_list()
    )


def latest_values(log: pl.DataFrame) -> pl.DataFrame:
    """One value per (step, key): from the last file that logged the step, its last record."""
    last = log.group_by("step").agg(pl.col("segment").max().alias("_last"))
    return (
        log.join(last, on="step")
        .filter(pl.col("segment") == pl.col("_last"))
        .drop("_last")
        .sort("segment", "record", "position")
        .unique(["step", "key"], keep="last", maintain_order=True)
    )


def phase_order(timers: pl.DataFrame) -> list[str]:
    """Phases in execution order: VeRL's known stages, then others by place in the record, step."""
    positions = timers.group_by("phase").agg(pl.col("position").median()).sort("position", "phase")
    names = positions["phase"].to_list()
    known = [name for name in STAGE_ORDER if name in names]
    others = [name for name in names if name not in STAGE_ORDER and name != STEP]
    return known + others + ([STEP] if STEP in names else [])


def ordered_phases(times: pl.DataFrame) -> list[str]:
    """The phases of a :func:`phase_times` frame in execution order (``step`` last)."""
    return phase_order(times.with_columns(pl.int_range(pl.len()).over("step").alias("position")))


def in_order(frame: pl.DataFrame, names: list[str], *first: str) -> pl.DataFrame:
    """``frame`` sorted by ``first`` columns, then by the place of its ``phase`` in ``names``."""
    order = pl.DataFrame({"phase": names}, schema={"phase": pl.String}).with_row_index("_order")
    return frame.join(order, on="phase").sort(*first, "_order").drop("_order")


def phase_times(values: pl.DataFrame) -> pl.DataFrame:
    """``step, phase, seconds, source`` (:data:`PHASE_TIMES_COLUMNS`) from :func:`latest_values`.

    Every step has a ``step`` row: its step timer, else the sum of its phase timers (``source``
    :data:`SUMMED`). Ordered by step, then phases in execution order, ``step`` last.
    """
    ranked = (
        _timers(values)
        .filter(pl.col("value").is_not_null())
        .sort("step", "phase", "prefix_rank")
        .unique(["step", "phase"], keep="first", maintain_order=True)
    )
    order = [*(p for p in phase_order(ranked) if p != STEP), STEP]
    timers = ranked.select(
        "step", "phase", pl.col("value").alias("seconds"), pl.col("key").alias("source")
    )
    stages = timers.filter(pl.col("phase") != STEP)
    summed = (
        stages.group_by("step")
        .agg(pl.col("seconds").sum())
        .join(timers.filter(pl.col("phase") == STEP), on="step", how="anti")
        .select("step", pl.lit(STEP).alias("phase"), "seconds", pl.lit(SUMMED).alias("source"))
    )
    return in_order(pl.concat([timers, summed]), order, "step").cast(
        PHASE_TIMES_COLUMNS  # type: ignore[arg-type]
    )


def summed_steps(times: pl.DataFrame) -> list[int]:
    """The steps of :func:`phase_times` whose time is the sum of their phases (no step timer)."""
    if "source" not in times.columns:
        return []
    rows = times.filter((pl.col("phase") == STEP) & (pl.col("source") == SUMMED))
    return sorted(rows["step"].to_list())


def steps_table(values: pl.DataFrame, times: pl.DataFrame) -> pl.DataFrame:
    """One row per step: every metric but the phase timers, named as logged.

    Columns: ``step``, then ``timing_per_token_ms/*``, ``perf/*``, ``response_length/*`` and every
    other key, each group in the order VeRL logs it. Float64; null where a step lacks a key.
    """
    phases = times["phase"].unique().to_list()
    timer_keys = {prefix + phase for prefix in TIMER_PREFIXES for phase in phases}
    rest = values.filter(~pl.col("key").is_in([*timer_keys, "step"]))
    keys = rest["key"].unique(maintain_order=True).to_list()
    ranked = sorted(
        range(len(keys)),
        key=lambda i: (
            next((g for g, p in enumerate(STEP_GROUPS) if keys[i].startswith(p)), len(STEP_GROUPS)),
            i,
        ),
    )
    steps = values.select("step").unique().sort("step")
    if not keys:
        return steps
    wide = rest.pivot(on="key", index="step", values="value")
    return steps.join(wide, on="step", how="left").select(
        "step", *(pl.col(keys[i]).cast(pl.Float64) for i in ranked)
    )


def step_totals(times: pl.DataFrame) -> pl.DataFrame:
    """Per step: ``step_s`` (its ``step`` row), ``timed_s`` (its phases) and ``other_s``.

    ``other_s`` is the step's time no phase timer covers (never below 0); null for a step whose
    time is the sum of its phases (:func:`summed_steps`): there it is not seen.
    """
    timed = (
        times.filter(pl.col("phase") != STEP)
        .group_by("step")
        .agg(pl.col("seconds").sum().alias("timed_s"))
    )
    whole = times.filter(pl.col("phase") == STEP).select("step", pl.col("seconds").alias("step_s"))
    summed = pl.col("step").is_in(summed_steps(times))
    return (
        whole.join(timed, on="step", how="left")
        .with_columns(pl.col("timed_s").fill_null(0.0))
        .with_columns(
            pl.when(~summed)
            .then((pl.col("step_s") - pl.col("timed_s")).clip(lower_bound=0.0))
            .alias("other_s")
        )
        .select("step", "step_s", "timed_s", "other_s")
        .sort("step")
    )


def overtimed_steps(times: pl.DataFrame, *, tolerance: float = 0.01) -> list[int]:
    """Steps whose phase timers add up to more than the step (nested or overlapping timers)."""
    totals = step_totals(times)
    return totals.filter(pl.col("timed_s") > pl.col("step_s") * (1 + tolerance))["step"].to_list()


def with_other(times: pl.DataFrame) -> pl.DataFrame:
    """The phases (no ``step`` row) plus one :data:`OTHER` row per step."""
    other = step_totals(times).filter(pl.col("other_s").is_not_null())
    other = other.select("step", pl.lit(OTHER).alias("phase"), pl.col("other_s").alias("seconds"))
    return pl.concat([times.filter(pl.col("phase") != STEP).select(other.columns), other])


def step_shares(times: pl.DataFrame) -> pl.DataFrame:
    """Per step: each phase, :data:`OTHER` and ``step``, its ``seconds`` and share of the step.

    Columns ``step, phase, seconds, step_s, share_pct``; ``share_pct`` = the phase's seconds /
    the step's seconds × 100, the definition of :mod:`analysis.aggregate.shares` on VeRL's
    timers (null where the step's time is 0). A step's phases and other add up to 100% (more
    where timers overlap). Rows only where the phase ran (:data:`OTHER` not where unseen).
    """
    totals = step_totals(times)
    whole = totals.select("step", pl.lit(STEP).alias("phase"), pl.col("step_s").alias("seconds"))
    rows = pl.concat([with_other(times), whole]).join(
        totals.select("step", "step_s"), on="step", how="left"
    )
    share = pl.when(pl.col("step_s") > 0).then(pl.col("seconds") / pl.col("step_s") * 100)
    order = [*(p for p in ordered_phases(times) if p != STEP), OTHER, STEP]
    return in_order(rows.with_columns(share.alias("share_pct")), order, "step")


def phase_summary(times: pl.DataFrame) -> pl.DataFrame:
    """Per phase (execution order), then :data:`OTHER` and ``step``: seconds and share of step.

    ``n_steps``, ``median_s``, ``p10_s``, ``p90_s``: its seconds over the steps it ran in;
    ``share_median_pct``, ``share_p10_pct``, ``share_p90_pct``: its share of the step
    (:func:`step_shares`), median and p10–p90 over those steps, as
    :func:`analysis.aggregate.shares.share_over_steps` summarizes every share.
    """
    shares = step_shares(times)
    order = [*(p for p in ordered_phases(times) if p != STEP), OTHER, STEP]
    seconds = shares.group_by("phase").agg(
        pl.len().cast(pl.Int64).alias("n_steps"),
        pl.col("seconds").median().alias("median_s"),
        pl.col("seconds").quantile(0.1, "linear").alias("p10_s"),
        pl.col("seconds").quantile(0.9, "linear").alias("p90_s"),
    )
    # one summary of a share over steps for traces and logs alike (median, p10–p90, linear)
    over = share_over_steps(
        shares.select(
            pl.col("phase").alias("canonical"),
            pl.lit(0, pl.Int64).alias("start_ns"),
            pl.col("share_pct").alias("time_share_pct"),
            pl.lit(None, pl.Float64).alias("energy_share_pct"),
        )
    ).select(
        pl.col("canonical").alias("phase"),
        pl.col("time_share_median").alias("share_median_pct"),
        pl.col("time_share_p10").alias("share_p10_pct"),
        pl.col("time_share_p90").alias("share_p90_pct"),
    )
    return in_order(seconds.join(over, on="phase", how="left"), order)
