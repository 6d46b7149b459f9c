"""Multi-turn tool-use rollouts (PolyTrace's ``multiturn_workload_step_{S}.jsonl``) per step.

One record per rollout sample: ``step, turns: [{turn, prompt_tokens, cached_tokens,
engine_latency_s, …}], tool_calls: [{turn, latency_s, status, …}], final_response_len,
final_response_loss_len, prompt_group_id, sample_id, validate, …`` (Search-R1 in PolyTrace).

Definitions, each used by every table:

- a sample's **turns** and **tool calls** are the lengths of its ``turns`` and ``tool_calls`` lists;
- **engine latency** is the sum of its turns' ``engine_latency_s``, **tool latency** the sum of its
  calls' ``latency_s``; a sample's **latency** is their sum (an agent loop generates, then calls
  the tool, then generates again, so they add up along the sample);
- the **prefix-cache hit ratio** (``prefix_cache_hit_fraction``) is Σ ``cached_tokens`` /
  Σ ``prompt_tokens`` over the turns;
- the **loss-masked share** (``loss_masked_fraction``) is 1 − Σ ``final_response_loss_len`` /
  Σ ``final_response_len``: response tokens (tool outputs, chat template) the loss leaves out
  (the records' ``response_loss_mask_rle`` adds up to the same counts);
- **tool vs engine latency**: ``tool_share_of_latency_fraction`` = Σ tool / (Σ tool + Σ engine)
  (``engine_share_of_latency_fraction`` the rest); ``engine_turn_latency_mean_s`` = Σ engine / Σ
  turns, ``tool_call_latency_mean_s`` = Σ tool / Σ tool calls;
- the **slowest decile** of a step is its ⌈n/10⌉ samples of the longest latency (ties by
  ``prompt_group_id``, ``sample_id``): the stragglers whose turn counts are compared with the median.

Percentiles are linear-interpolated (numpy's default), as in :func:`~.lengths.length_stats`.
Validation rollouts are left out of the tables. A ratio whose denominator is 0 is null, not 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ..errors import WorkloadInputError
from .lengths import checked_records, typed_select

MULTITURN_GLOB = "multiturn_workload_step_*.jsonl"
LAYOUT = "multiturn_workload"
DType = pl.DataType | type[pl.DataType]
#: top-level fields every record needs
REQUIRED = ("step", "turns", "tool_calls")
#: fields of each turn and each tool call the tables use (others are kept in the file, not read)
TURN_FIELDS: dict[str, DType] = {
    "prompt_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "engine_latency_s": pl.Float64,
}
TOOL_FIELDS: dict[str, DType] = {"latency_s": pl.Float64}
#: fields without which a quantity is null (the note says which), not an error
LOSS_FIELDS = ("final_response_len", "final_response_loss_len")
#: one in this many of a step's samples (rounded up) count as its stragglers: the slowest decile
SLOWEST_OF = 10


def _nested(file: Path, frame: pl.DataFrame, column: str, fields: dict[str, DType]) -> pl.Expr:
    """``column`` (a list of objects) as a list of structs of exactly ``fields``, typed.

    A file whose lists are all empty has them typed as lists of null: cast, no fields to check.
    """
    dtype = frame.schema[column]
    target = pl.List(pl.Struct(fields))
    if dtype == pl.List(pl.Null) or dtype == pl.Null:
        return pl.col(column).cast(target)
    inner = dtype.inner if isinstance(dtype, pl.List) else None
    if not isinstance(inner, pl.Struct):
        raise WorkloadInputError(f"{file}: field {column} is not a list of objects ({dtype})")
    have = {f.name for f in inner.fields}
    missing = [f for f in fields if f not in have]
    if missing:
        raise WorkloadInputError(
            f"{file}: {column} entries lack field(s) {', '.join(missing)} of the {LAYOUT} layout"
        )
    picked = [pl.element().struct.field(f).cast(t) for f, t in fields.items()]
    return pl.col(column).list.eval(pl.struct(picked))


def _optional(frame: pl.DataFrame, name: str, dtype: DType, default: pl.Expr) -> pl.Expr:
    return (pl.col(name) if name in frame.columns else default).cast(dtype).alias(name)


def _file_samples(file: Path, frame: pl.DataFrame) -> pl.DataFrame:
    """One file's records (required fields checked) as typed columns (turns and calls nested)."""
    turns = _nested(file, frame, "turns", TURN_FIELDS)
    tools = _nested(file, frame, "tool_calls", TOOL_FIELDS)
    has_loss = all(c in frame.columns for c in LOSS_FIELDS)
    null_int = pl.lit(None, dtype=pl.Int64)
    return typed_select(
        file,
        frame,
        pl.col("step").cast(pl.Int64),
        _optional(frame, "validate", pl.Boolean, pl.lit(False)),
        _optional(frame, "prompt_group_id", pl.Int64, pl.lit(0)),
        _optional(frame, "sample_id", pl.Int64, pl.int_range(pl.len())),
        turns.alias("turns"),
        tools.alias("tool_calls"),
        (pl.col("final_response_len") if has_loss else null_int)
        .cast(pl.Int64)
        .alias("response_len"),
        (pl.col("final_response_loss_len") if has_loss else null_int)
        .cast(pl.Int64)
        .alias("loss_len"),
    )


def _check_complete(file: Path, typed: pl.DataFrame) -> pl.DataFrame:
    """``typed``, or a WorkloadInputError naming the first field some record leaves null.

    A null latency or token count would count as 0 in the sums: a wrong number, so refused.
    """
    if typed["step"].null_count():
        raise WorkloadInputError(f"{file}: {typed['step'].null_count()} record(s) lack field step")
    for column, fields in (("turns", TURN_FIELDS), ("tool_calls", TOOL_FIELDS)):
        if typed[column].null_count():
            raise WorkloadInputError(
                f"{file}: {typed[column].null_count()} record(s) have no {column} list"
            )
        for name in fields:
            nulls = pl.col(column).list.eval(pl.element().struct.field(name).is_null())
            n = typed.select(nulls.list.sum().sum()).item()
            if n:
                raise WorkloadInputError(
                    f"{file}: {n} {column} entries lack field {name} of the {LAYOUT} layout"
                )
    return typed


def read_multiturn(files: Sequence[Path]) -> pl.DataFrame:
    """Records of ``multiturn_workload_step_*.jsonl`` files, one row per sample, nested.

    Columns: ``step, validate, prompt_group_id, sample_id, turns (list of {prompt_tokens,
    cached_tokens, engine_latency_s}), tool_calls (list of {latency_s}), response_len,
    loss_len`` (the last two null where the records lack them). A malformed or foreign file is a
    :class:`~analysis.errors.WorkloadInputError` naming it.
    """
    return pl.concat(
        [
            _check_complete(file, _file_samples(file, frame))
            for file, frame in checked_records(files, REQUIRED, LAYOUT)
        ]
    )


#: how to read the latency sums (the CLI prints it; the report's section title says it short)
LATENCY_NOTE = (
    "multiturn: engine and tool latencies are summed over samples (sample-seconds, not the "
    "step's wall time: samples run concurrently and the records carry no timestamps); an "
    "engine latency includes the wait in the shared engine's queue, not only decoding"
)


#: a step with fewer samples than this share of the largest step's is named as partial
PARTIAL_OF_LARGEST = 0.5


def missing_fields_notes(records: pl.DataFrame) -> list[str]:
    """What the tables cannot say from these records, one line each (none when all is there)."""
    if records["loss_len"].null_count() < records.height:
        return []
    return [
        f"multiturn: loss_masked_fraction not available: the records lack {' or '.join(LOSS_FIELDS)}"
    ]


def partial_step_notes(steps: pl.DataFrame) -> list[str]:
    """A note naming steps of under half the samples of the largest step (a log cut mid-step).

    Their numbers cover only the samples recorded, which may not be typical of a whole step.
    """
    if steps.height < 2:
        return []
    largest = int(steps["samples"].max())  # type: ignore[arg-type]
    short = steps.filter(pl.col("samples") < PARTIAL_OF_LARGEST * largest)
    if short.is_empty():
        return []
    parts = ", ".join(f"{r['step']} ({r['samples']:,})" for r in short.iter_rows(named=True))
    return [
        f"multiturn: step(s) {parts} hold under half the samples of the largest step "
        f"({largest:,}): partial steps, their numbers cover only the samples recorded"
    ]


def samples(records: pl.DataFrame) -> pl.DataFrame:
    """One row per training sample (validation left out) with its totals (module docstring)."""
    turn = pl.col("turns").list
    return (
        records.filter(~pl.col("validate"))
        .select(
            "step",
            "prompt_group_id",
            "sample_id",
            turn.len().cast(pl.Int64).alias("turns"),
            pl.col("tool_calls").list.len().cast(pl.Int64).alias("tool_calls"),
            turn.eval(pl.element().struct.field("engine_latency_s")).list.sum().alias("engine_s"),
            pl.col("tool_calls")
            .list.eval(pl.element().struct.field("latency_s"))
            .list.sum()
            .alias("tool_s"),
            turn.eval(pl.element().struct.field("prompt_tokens")).list.sum().alias("prompt_tokens"),
            turn.eval(pl.element().struct.field("cached_tokens")).list.sum().alias("cached_tokens"),
            "response_len",
            "loss_len",
        )
        .with_columns((pl.col("engine_s") + pl.col("tool_s")).alias("latency_s"))
        .pipe(_mark_slowest)
    )


def _mark_slowest(rows: pl.DataFrame) -> pl.DataFrame:
    """``slowest``: the sample is in its step's slowest decile (module docstring)."""
    order = rows.sort(
        ["step", "latency_s", "prompt_group_id", "sample_id"],
        descending=[False, True, False, False],
    )
    place = pl.int_range(pl.len()).over("step")
    wanted = (pl.len().over("step") + SLOWEST_OF - 1) // SLOWEST_OF  # integers: no 3.0000…1
    return order.with_columns((place < wanted).alias("slowest"))


def _known_sum(column: str) -> pl.Expr:
    """The column's sum, null (not 0) where every value is null: the records lack the field."""
    col = pl.col(column)
    return pl.when(col.null_count() < pl.len()).then(col.sum()).otherwise(None)


def _share(part: pl.Expr, whole: pl.Expr) -> pl.Expr:
    """``part / whole``, null where ``whole`` is 0 (nothing to share out, not a share of 0)."""
    return pl.when(whole > 0).then(part / whole).otherwise(None)


def step_table(per_sample: pl.DataFrame) -> pl.DataFrame:
    """``multiturn_steps.csv``: per step, turns, tool vs engine latency, cache, loss mask, stragglers."""
    turns = pl.col("turns").cast(pl.Float64)
    tool, engine = pl.col("tool_s").sum(), pl.col("engine_s").sum()
    return (
        per_sample.group_by("step")
        .agg(
            pl.len().cast(pl.Int64).alias("samples"),
            turns.mean().alias("turns_mean"),
            turns.quantile(0.5, "linear").alias("turns_p50"),
            turns.quantile(0.9, "linear").alias("turns_p90"),
            pl.col("turns").max().alias("turns_max"),
            pl.col("turns").sum().alias("turns_total"),
            pl.col("tool_calls").sum().alias("tool_calls"),
            engine.alias("engine_latency_sum_s"),
            tool.alias("tool_latency_sum_s"),
            _share(tool, tool + engine).alias("tool_share_of_latency_fraction"),
            _share(engine, tool + engine).alias("engine_share_of_latency_fraction"),
            _share(engine, pl.col("turns").sum()).alias("engine_turn_latency_mean_s"),
            _share(tool, pl.col("tool_calls").sum()).alias("tool_call_latency_mean_s"),
            pl.col("prompt_tokens").sum(),
            pl.col("cached_tokens").sum(),
            _share(pl.col("cached_tokens").sum(), pl.col("prompt_tokens").sum()).alias(
                "prefix_cache_hit_fraction"
            ),
            _known_sum("response_len").alias("response_tokens"),
            _known_sum("loss_len").alias("loss_tokens"),
            (1 - _share(_known_sum("loss_len"), _known_sum("response_len"))).alias(
                "loss_masked_fraction"
            ),
            pl.col("latency_s").quantile(0.5, "linear").alias("sample_latency_p50_s"),
            pl.col("latency_s").max().alias("sample_latency_max_s"),
            pl.col("turns")
            .sort_by(["latency_s", "prompt_group_id", "sample_id"], descending=[True, False, False])
            .first()
            .alias("slowest_sample_turns"),
            pl.col("slowest").sum().cast(pl.Int64).alias("slowest_decile_samples"),
            turns.filter(pl.col("slowest")).mean().alias("slowest_decile_turns_mean"),
        )
        .with_columns(
            _share(pl.col("slowest_decile_turns_mean"), pl.col("turns_p50")).alias(
                "slowest_decile_turns_over_p50"
            ),
        )
        .sort("step")
    )


def turn_count_table(per_sample: pl.DataFrame) -> pl.DataFrame:
    """``multiturn_turn_counts.csv``: per step and turn count, samples, latency, straggler share.

    ``share_of_slowest_decile_fraction``: the share of the step's slowest decile with this turn
    count, against ``share_of_samples_fraction``, its share of all samples: a larger share among
    the slowest means this turn count makes stragglers.
    """
    latency = pl.col("latency_s")
    return (
        per_sample.group_by("step", "turns")
        .agg(
            pl.len().cast(pl.Int64).alias("samples"),
            pl.col("tool_calls").sum(),
            latency.mean().alias("sample_latency_mean_s"),
            latency.quantile(0.5, "linear").alias("sample_latency_p50_s"),
            latency.max().alias("sample_latency_max_s"),
            pl.col("slowest").sum().cast(pl.Int64).alias("slowest_decile_samples"),
        )
        .with_columns(
            (pl.col("samples") / pl.col("samples").sum().over("step")).alias(
                "share_of_samples_fraction"
            ),
            (
                pl.col("slowest_decile_samples")
                / pl.col("slowest_decile_samples").sum().over("step")
            ).alias("share_of_slowest_decile_fraction"),
        )
        .sort("step", "turns")
    )


def turn_table(records: pl.DataFrame) -> pl.DataFrame:
    """``multiturn_turns.csv``: per step and turn index (0 first), prompt vs cached tokens, engine time.

    The first turn's prompt is cached only across samples of a prompt; later turns re-send the
    conversation so far, which the engine's prefix cache can hold.
    """
    turns = (
        records.filter(~pl.col("validate"))
        .select("step", pl.col("turns"))
        .with_columns(pl.int_ranges(pl.col("turns").list.len()).alias("turn"))
        .explode("turns", "turn")
        .drop_nulls("turn")
        .unnest("turns")
    )
    return (
        turns.group_by("step", "turn")
        .agg(
            pl.len().cast(pl.Int64).alias("turns"),
            pl.col("prompt_tokens").sum(),
            pl.col("cached_tokens").sum(),
            pl.col("engine_latency_s").mean().alias("engine_latency_mean_s"),
        )
        .with_columns(
            _share(pl.col("cached_tokens"), pl.col("prompt_tokens")).alias(
                "prefix_cache_hit_fraction"
            )
        )
        .sort("step", "turn")
    )


def multiturn_tables(records: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The three tables by file stem: steps, turn counts, turn indices."""
    per_sample = samples(records)
    return {
        "multiturn_steps": step_table(per_sample),
        "multiturn_turn_counts": turn_count_table(per_sample),
        "multiturn_turns": turn_table(records),
    }
