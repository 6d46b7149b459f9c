"""Response-length records in PolyTrace's layout, and their statistics per step.

Layouts (read as they are, so PolyTrace's published traces work too):

- ``packed_lengths_step_{S}.jsonl``: one row per prompt, ``{step, rank, tp_rank, dp_rank,
  local_index, input, output: [n_sampling lengths], n_sampling, validate}``;
- ``reward_timings_step_{S}.jsonl``: one row per rank, ``{step, rank, tp_rank, dp_rank,
  batch_size?, reward_time_s, response_sum, response_mean, response_max, validate}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl

from analysis.errors import InputError, WorkloadInputError

PACKED_GLOB = "packed_lengths_step_*.jsonl"
REWARD_GLOB = "reward_timings_step_*.jsonl"
PACKED_REQUIRED = ("step", "rank", "dp_rank", "input", "output")
REWARD_REQUIRED = (
    "step",
    "rank",
    "dp_rank",
    "reward_time_s",
    "response_sum",
    "response_mean",
    "response_max",
)


def _read_json_lines(file: Path) -> pl.DataFrame:
    """A JSON-lines file as a frame; a malformed file is a WorkloadInputError."""
    try:
        return pl.read_ndjson(file, infer_schema_length=None)
    except OSError:
        raise
    except Exception as exc:  # polars raises ComputeError and others for bad JSON
        raise WorkloadInputError(f"{file}: not JSON lines ({_first_line(exc)})") from exc


def _typed(file: Path, frame: pl.DataFrame, *columns: pl.Expr) -> pl.DataFrame:
    """``frame.select(*columns)``; a field of the wrong type is a WorkloadInputError naming it."""
    try:
        return frame.select(*columns)
    except pl.exceptions.PolarsError as exc:  # e.g. "input": "abc", or "output": 3
        raise WorkloadInputError(
            f"{file}: a field has the wrong type for its layout ({_first_line(exc)})"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _files(paths: Sequence[str | Path], pattern: str) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.glob(pattern))
        elif path.match(pattern):
            found.append(path)
    return found


def _records(
    files: Sequence[Path], required: Sequence[str], layout: str
) -> Iterator[tuple[Path, pl.DataFrame]]:
    """Each JSON-lines file with its records, checked for the ``layout``'s required fields."""
    for file in files:
        frame = _read_json_lines(file)
        missing = [c for c in required if c not in frame.columns]
        if missing:
            raise WorkloadInputError(
                f"{file}: lacks field(s) {', '.join(missing)} of the {layout} layout"
            )
        yield file, frame


def read_packed_lengths(paths: Sequence[str | Path]) -> pl.DataFrame:
    """One row per response, from files or folders of ``packed_lengths_step_*.jsonl``.

    Columns: ``step, rank, dp_rank, tp_rank, prompt_index, sample, input_len, output_len,
    validate``.
    """
    files = _files(paths, PACKED_GLOB)
    if not files:
        raise InputError(f"no {PACKED_GLOB} file in {', '.join(map(str, paths))}")
    frames = [
        _typed(
            file,
            frame,
            pl.col("step").cast(pl.Int64),
            pl.col("rank").cast(pl.Int64),
            pl.col("dp_rank").cast(pl.Int64),
            (pl.col("tp_rank") if "tp_rank" in frame.columns else pl.lit(0))
            .cast(pl.Int64)
            .alias("tp_rank"),
            (pl.col("local_index") if "local_index" in frame.columns else pl.int_range(pl.len()))
            .cast(pl.Int64)
            .alias("prompt_index"),
            pl.col("input").cast(pl.Int64).alias("input_len"),
            pl.col("output").cast(pl.List(pl.Int64)),
            (pl.col("validate") if "validate" in frame.columns else pl.lit(False))
            .cast(pl.Boolean)
            .alias("validate"),
        )
        for file, frame in _records(files, PACKED_REQUIRED, "packed_lengths")
    ]
    prompts = pl.concat(frames)
    return (
        prompts.with_columns(pl.int_ranges(pl.col("output").list.len()).alias("sample"))
        .explode("output", "sample")
        .rename({"output": "output_len"})
        .filter(pl.col("output_len").is_not_null())
        .sort("step", "rank", "prompt_index", "sample")
    )


def read_reward_timings(paths: Sequence[str | Path]) -> pl.DataFrame | None:
    """Per step and rank: ``reward_time_s`` and the response-length sums it reports (or None)."""
    files = _files(paths, REWARD_GLOB)
    if not files:
        return None
    frames = [
        _typed(
            file,
            frame,
            pl.col("step").cast(pl.Int64),
            pl.col("rank").cast(pl.Int64),
            pl.col("dp_rank").cast(pl.Int64),
            pl.col("reward_time_s").cast(pl.Float64),
            pl.col("response_sum").cast(pl.Int64),
            pl.col("response_mean").cast(pl.Float64),
            pl.col("response_max").cast(pl.Int64),
        )
        for file, frame in _records(files, REWARD_REQUIRED, "reward_timings")
    ]
    return pl.concat(frames).sort("step", "rank")


def length_stats(
    responses: pl.DataFrame, *, cap: int | None = None, validate: bool = False
) -> pl.DataFrame:
    """Per-step statistics of response length.

    Count, mean, p50, p90, p99, max, max/mean, coefficient of variation, and the fraction at the
    length cap (``cap``: the rollout's max response length; null when unknown). Percentiles are
    linear-interpolated (numpy's default). Validation rollouts are left out unless ``validate``.
    """
    rows = responses if validate else responses.filter(~pl.col("validate"))
    length = pl.col("output_len").cast(pl.Float64)
    return (
        rows.group_by("step")
        .agg(
            pl.len().cast(pl.Int64).alias("n_responses"),
            length.mean().alias("mean"),
            length.quantile(0.5, "linear").alias("p50"),
            length.quantile(0.9, "linear").alias("p90"),
            length.quantile(0.99, "linear").alias("p99"),
            pl.col("output_len").max().alias("max"),
            (length.std(ddof=0) / length.mean()).alias("cv"),
            ((pl.col("output_len") >= cap).mean() if cap else pl.lit(None, dtype=pl.Float64)).alias(
                "frac_at_cap"
            ),
            pl.col("output_len").sum().alias("tokens"),
        )
        .with_columns((pl.col("max") / pl.col("mean")).alias("max_over_mean"))
        .sort("step")
    )


def drift(stats: pl.DataFrame) -> pl.DataFrame:
    """How each statistic moves over steps: least-squares slope per step, first → last change."""
    rows = []
    steps = stats["step"].cast(pl.Float64)
    for column in ("mean", "p90", "p99", "max", "cv", "max_over_mean"):
        values = stats[column].cast(pl.Float64)
        n = stats.height
        slope = None
        if n >= 2:
            sx, sy = steps - steps.mean(), values - values.mean()
            denom = float((sx * sx).sum())
            slope = float((sx * sy).sum()) / denom if denom else None
        first = float(values[0]) if n else None
        last = float(values[-1]) if n else None
        rows.append(
            {
                "statistic": column,
                "first": first,
                "last": last,
                "change_pct": (last - first) / first * 100 if first and last is not None else None,
                "slope_per_step": slope,
            }
        )
    return pl.DataFrame(rows)


def rank_imbalance(responses: pl.DataFrame, rewards: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: tokens per DP rank, max/mean across ranks; reward time max/mean when known."""
    per_rank = (
        responses.filter(~pl.col("validate"))
        .group_by("step", "dp_rank")
        .agg(pl.col("output_len").sum().alias("tokens"))
    )
    table = per_rank.group_by("step").agg(
        pl.len().alias("dp_ranks"),
        (pl.col("tokens").max() / pl.col("tokens").mean()).alias("tokens_max_over_mean"),
    )
    if rewards is not None:
        reward = rewards.group_by("step").agg(
            (pl.col("reward_time_s").max() / pl.col("reward_time_s").mean()).alias(
                "reward_time_max_over_mean"
            )
        )
        table = table.join(reward, on="step", how="left")
    return table.sort("step")
