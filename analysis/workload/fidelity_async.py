"""Trace phase times against VeRL 0.9.1's fully async trainer and rollouter timers.

What VeRL's fully async trainer logs (``verl/experimental/fully_async_policy/fully_async_trainer.py``
and ``detach_utils.MetricsAggregator``), all through the trainer actor's logger, with ``step`` =
its ``current_param_version``:

- **trainer records**: per sync cycle, the *sum* over the trainer steps it aggregated of each
  ``timing_s/<stage>`` (``step, gen, reward, old_log_prob, ref, values, adv, update_critic,
  update_actor``, ``wait_for_enough_samples``, and ``timing_s/timing_s/param_sync``: VeRL's timer
  is named ``timing_s/param_sync``, and ``compute_timing_metrics`` adds the prefix again), with
  ``training/global_step`` = the last trainer step aggregated. A record is logged at the sync
  that *ends* the next cycle (before that step's own metrics are added), and the last one after
  the loop, so a record's steps are those after the previous record's ``training/global_step``
  up to its own. The nvtx_phases hooks number the trainer's ranges with ``global_steps``: the
  trace's value for a record is the sum of the stage's ranges over those steps. The trainer's
  last ``fit_step`` (ended by the rollouter's end-of-data signal inside ``gen``) logs nothing.
- **rollouter records** (``reset_staleness``, once per sync, the first before training):
  ``fully_async/rollouter/version_time`` = the time since the previous ``reset_staleness`` (the
  first: since the rollouter was created). The hooks' ``version`` ranges run from one
  ``reset_staleness`` to the next, so the k-th record (k ≥ 1) pairs with the k-th ``version``
  range in start order (stage ``version``); the first record covers start-up, no range.
  ``fully_async/rollouter/active_time`` (stage ``active``) = ``idle_start_time −
  step_start_time`` when the rollouter went idle in the version, else ``version_time``; in the
  trace: from the version's start to the start of its last ``staleness_wait`` (the hooks open it
  where VeRL sets ``idle_start_time``: :mod:`nvtx_phases.verl_rollout`), else the version's wall.
- **validation records**: ``rollouter/validate_time``, paired in order with the ``validate``
  ranges (VeRL's timer, renamed by ``nvtx_phases.naming.ASYNC_RENAMES``; at any depth: nsys nests
  it in the rollouter's ``version/gen`` by time).

Errors, accuracy and the summary are as :mod:`analysis.workload.fidelity` defines them (the same
``to_markdown`` prints it); ``step`` in the rows is VeRL's logged step.
"""

from __future__ import annotations

from typing import Any, cast

import polars as pl

from nvtx_phases.naming import ASYNC_RENAMES, PATH_SEP, VERSION

from ..model import Analysis
from .fidelity import STAGES, same_run_check, stage_times
from .fidelity_scores import MIN_SCORED_S, stage_accuracy

#: marks a trainer record of the fully async trainer (a ``MetricsAggregator`` "last" metric)
GLOBAL_STEP_KEY = "training/global_step"
#: the rollouter's version timer
VERSION_TIME_KEY = "fully_async/rollouter/version_time"
#: the rollouter's active part of a version (until it went idle)
ACTIVE_TIME_KEY = "fully_async/rollouter/active_time"
#: the rollouter's validation timer (``do_validate``)
VALIDATE_KEY = "rollouter/validate_time"
VALIDATE, ACTIVE, STALENESS_WAIT = "validate", "active", "staleness_wait"
#: the trainer's stages inside ``step``, with the async ones
ASYNC_STAGES = (*STAGES, "param_sync", "wait_for_enough_samples")
TRAINER, ROLLOUT = "trainer", "rollout"
ROW_SCHEMA = pl.Schema(
    {
        "step": pl.Int64(),
        "axis": pl.String(),
        "trace_first": pl.Int64(),
        "trace_last": pl.Int64(),
        "stage": pl.String(),
        "trace_s": pl.Float64(),
        "logged_s": pl.Float64(),
        "cut_at_capture_end": pl.Boolean(),
    }
)
CUT = "cut_at_capture_end"


def is_async_log(records: pl.DataFrame) -> bool:
    """Whether a log (``verl_logs.read_log``'s frame) is the fully async trainer's."""
    keys = set(records["key"].unique().to_list())
    return VERSION_TIME_KEY in keys or (
        GLOBAL_STEP_KEY in keys and any(k.startswith("fully_async/") for k in keys)
    )


def trainer_records(records: pl.DataFrame) -> pl.DataFrame:
    """``record, step, last_step, stage, logged_s``: the trainer's aggregated timers per record."""
    last = records.filter(pl.col("key") == GLOBAL_STEP_KEY).select(
        "segment", "record", pl.col("value").cast(pl.Int64).alias("last_step")
    )
    timers = records.filter(pl.col("key").str.starts_with("timing_s/")).with_columns(
        pl.col("key").str.strip_prefix("timing_s/").replace(ASYNC_RENAMES).alias("stage")
    )
    return (
        timers.join(last, on=["segment", "record"], how="inner")
        .filter(pl.col("stage").is_in(ASYNC_STAGES) & pl.col("value").is_not_null())
        .select(
            "segment", "record", "step", "last_step", "stage", pl.col("value").alias("logged_s")
        )
        .sort("segment", "record", "stage")
    )


def windows(trainer: pl.DataFrame) -> pl.DataFrame:
    """Per trainer record: the trainer steps it aggregated, ``first_step``…``last_step``."""
    per_record = (
        trainer.select("segment", "record", "step", "last_step").unique().sort("segment", "record")
    )
    return per_record.with_columns(
        (pl.col("last_step").shift(1).fill_null(0) + 1).alias("first_step")
    )


def _window_ranges(analysis: Analysis) -> pl.DataFrame:
    """``pid, path, start_ns, end_ns, cut``: every window range (one row per range)."""
    if analysis.ranges is not None:
        rows = analysis.ranges.filter(pl.col("attribution") == "window")
    else:  # an analysis folder without ranges.parquet: the window rows
        rows = analysis.phases.filter(pl.col("attribution") == "window")
    flag = pl.col(CUT) if CUT in rows.columns else pl.lit(False)
    pid = pl.col("pid") if "pid" in rows.columns else pl.lit(None, pl.Int64)
    return rows.select(
        pid.alias("pid"), "path", "start_ns", "end_ns", flag.fill_null(False).alias("cut")
    ).unique(["pid", "path", "start_ns", "end_ns"])


def _ordered(rows: pl.DataFrame) -> pl.DataFrame:
    """``ordinal, start_ns, end_ns, trace_s, cut``: ``rows`` in start order."""
    return (
        rows.sort("start_ns", "end_ns")
        .select(
            "pid",
            "start_ns",
            "end_ns",
            ((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("trace_s"),
            "cut",
        )
        .with_row_index("ordinal")
    )


def version_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """The rollouter's ``version`` ranges in start order."""
    return _ordered(ranges.filter(pl.col("path") == VERSION))


def validate_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """The ``validate`` ranges, at any depth, in start order."""
    name = pl.col("path").str.split(PATH_SEP).list.last()
    return _ordered(ranges.filter(name == VALIDATE))


def active_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """Per ``version`` range: its start to the start of its last ``staleness_wait``, else its wall."""
    versions = version_ranges(ranges)
    waits = (
        ranges.filter(pl.col("path") == VERSION + PATH_SEP + STALENESS_WAIT)
        .select("pid", pl.col("start_ns").alias("wait_ns"))
        .sort("wait_ns")
    )
    owner = waits.join_asof(
        versions.select("pid", "ordinal", "start_ns", "end_ns").sort("start_ns"),
        left_on="wait_ns",
        right_on="start_ns",
        by="pid",
        strategy="backward",
    ).filter(pl.col("wait_ns") <= pl.col("end_ns"))
    last_wait = owner.group_by("ordinal").agg(pl.col("wait_ns").max())
    return (
        versions.join(last_wait, on="ordinal", how="left")
        .with_columns(
            pl.when(pl.col("wait_ns").is_not_null())
            .then((pl.col("wait_ns") - pl.col("start_ns")) / 1e9)
            .otherwise(pl.col("trace_s"))
            .alias("trace_s")
        )
        .drop("wait_ns")
    )


def _in_order(
    records: pl.DataFrame, key: str, ranges: pl.DataFrame, stage: str, skip: int
) -> pl.DataFrame:
    """The ``key`` records paired in log order with ``ranges`` (``skip`` records first).

    ``trace_s`` is null for a record past the last range (a sync after generation ended).
    """
    logged = (
        records.filter((pl.col("key") == key) & pl.col("value").is_not_null())
        .sort("segment", "record")
        .with_row_index("ordinal")
        .filter(pl.col("ordinal") >= skip)
        .with_columns((pl.col("ordinal") - skip).alias("ordinal"))
    )
    return logged.join(ranges, on="ordinal", how="left").select(
        "step",
        pl.lit(ROLLOUT).alias("axis"),
        pl.col("ordinal").cast(pl.Int64).alias("trace_first"),
        pl.col("ordinal").cast(pl.Int64).alias("trace_last"),
        pl.lit(stage).alias("stage"),
        "trace_s",
        pl.col("value").alias("logged_s"),
        pl.col("cut").alias(CUT),
    )


def _trainer_rows(
    analysis: Analysis, spans: pl.DataFrame, trainer: pl.DataFrame
) -> tuple[pl.DataFrame, list[int]]:
    """Per trainer record and stage: the sum of the stage's ranges over the record's steps."""
    traced = stage_times(analysis)
    steps_of = spans.select(
        "segment",
        "record",
        pl.int_ranges("first_step", pl.col("last_step") + 1).alias("trace_step"),
    ).explode("trace_step")
    summed = (
        steps_of.join(traced, left_on="trace_step", right_on="step", how="inner")
        .group_by("segment", "record", "stage")
        .agg(pl.col("trace_s").sum(), pl.col("cut").any())
    )
    rows = (
        trainer.join(spans.select("segment", "record", "first_step"), on=["segment", "record"])
        .join(summed, on=["segment", "record", "stage"], how="left")
        .select(
            "step",
            pl.lit(TRAINER).alias("axis"),
            pl.col("first_step").alias("trace_first"),
            pl.col("last_step").alias("trace_last"),
            "stage",
            "trace_s",
            "logged_s",
            pl.col("cut").alias(CUT),
        )
    )
    return rows, sorted(set(traced["step"].drop_nulls().to_list()))


def compare_async(analysis: Analysis, records: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """Per (record, stage) errors against the fully async trainer's and rollouter's timers.

    ``records``: :func:`analysis.workload.verl_logs.read_log` of the console log. Rows: VeRL's
    ``step``, the ``axis`` (trainer: ``trace_first``…``trace_last`` are the trainer steps summed;
    rollout: the 0-based place of the range in start order), stage, both times, error.
    """
    trainer = trainer_records(records)
    spans = windows(trainer)
    trainer_rows, trace_steps = _trainer_rows(analysis, spans, trainer)
    ranges = _window_ranges(analysis)
    versions = version_ranges(ranges)
    rollout_rows = pl.concat(
        [
            _in_order(records, VERSION_TIME_KEY, versions, VERSION, skip=1),
            _in_order(records, ACTIVE_TIME_KEY, active_ranges(ranges), ACTIVE, skip=1),
            _in_order(records, VALIDATE_KEY, validate_ranges(ranges), VALIDATE, skip=0),
        ]
    )
    rows = pl.concat([trainer_rows.cast(ROW_SCHEMA), rollout_rows.cast(ROW_SCHEMA)]).filter(
        pl.col("logged_s") > 0
    )
    unpaired = rows.filter(pl.col("trace_s").is_null())
    # rollouter records past its last version range: syncs after its generation ended
    after_generation = unpaired.filter(
        pl.col("stage").is_in([VERSION, ACTIVE]) & (pl.col("trace_first") >= versions.height)
    )
    missing = unpaired.join(
        after_generation, on=["axis", "stage", "trace_first", "step"], how="anti"
    )
    both = rows.filter(pl.col("trace_s").is_not_null()).with_columns(
        pl.col(CUT).fill_null(False),
        ((pl.col("trace_s") - pl.col("logged_s")) / pl.col("logged_s") * 100).alias("error_pct"),
    )
    logged_last = int(cast(int, spans["last_step"].max())) if spans.height else 0
    summary = _summary(both, missing, after_generation, trace_steps, logged_last)
    return both.sort("axis", "step", "trace_first", "stage"), summary


def _summary(
    both: pl.DataFrame,
    missing: pl.DataFrame,
    after_generation: pl.DataFrame,
    trace_steps: list[int],
    logged_last: int,
) -> dict[str, Any]:
    """The summary :func:`analysis.workload.fidelity.to_markdown` prints."""
    scored_rows = both.filter(~pl.col(CUT))
    per_stage, scored, unscored, overall = stage_accuracy(scored_rows)
    covered = [s for s in trace_steps if s <= logged_last]
    after = [s for s in trace_steps if s > logged_last]
    window_pairs = [[s, s] for s in covered]
    summary: dict[str, Any] = {
        "stages": {row.pop("stage"): row for row in per_stage.iter_rows(named=True)},
        "overall_accuracy_pct": overall,
        "n_pairs": scored_rows.height,
        "n_scored_pairs": scored.height,
        "min_scored_logged_s": MIN_SCORED_S,
        "unscored_stages": unscored,
        "matched_steps": sorted(set(scored_rows["step"].to_list())),
        "step_alignment": {
            "mode": "windows",
            "pairs": window_pairs,
            "note": (
                "fully async trainer: each trainer record sums its stage timers over the "
                "trainer steps after the previous record's training/global_step up to its own "
                "(rows trace_first…trace_last); rollouter records (version_time, active_time) "
                "pair in order with the version ranges, the first record (start-up) with none"
            ),
        },
        "cut_pairs": [[r["step"], r["stage"]] for r in both.filter(CUT).iter_rows(named=True)],
        "missing_in_trace": [[r["step"], r["stage"]] for r in missing.iter_rows(named=True)],
        "trace_steps_not_logged": after,
        "versions_after_generation": sorted(set(after_generation["step"].to_list())),
    }
    summary["same_run"] = same_run_check(covered, covered, window_pairs, scored, overall)
    notes = []
    if after:
        notes.append(
            f"trainer step(s) {', '.join(map(str, after))} after the last logged record: VeRL "
            "logs no timers for its last fit_step (ended inside gen by the rollouter's "
            "end-of-data signal)"
        )
    n_after = after_generation.filter(pl.col("stage") == VERSION).height
    if n_after:
        notes.append(
            f"{n_after} rollouter version_time record(s) (VeRL step(s) "
            f"{', '.join(map(str, summary['versions_after_generation']))}) after its last "
            "version range: syncs once its generation had ended, when it generates with no "
            "version"
        )
    if notes:
        summary["same_run"]["note"] = "; ".join(notes)
    return summary
