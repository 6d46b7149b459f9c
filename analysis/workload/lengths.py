"""Response-length records in PolyTrace's layout, and their statistics per step.

Layouts (read as they are, so PolyTrace's published traces work too):

- ``packed_lengths_step_{S}.jsonl``: one row per prompt, ``{step, rank, tp_rank, dp_rank,
  local_index, input, output: [n_sampling lengths], n_sampling, validate}``;
- ``reward_timings_step_{S}.jsonl``: one row per rank, ``{step, rank, tp_rank, dp_rank,
  batch_size?, reward_time_s, response_sum, response_mean, response_max, validate}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import polars as pl

from ..errors import InputError, WorkloadInputError

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


def read_json_lines(file: Path) -> pl.DataFrame:
    """A JSON-lines file as a frame; a malformed file is a WorkloadInputError."""
    try:
        return pl.read_ndjson(file, infer_schema_length=None)
    except OSError:
        raise
    except Exception as exc:  # polars raises ComputeError and others for bad JSON
        raise WorkloadInputError(f"{file}: not JSON lines ({_first_line(exc)})") from exc


def typed_select(file: Path, frame: pl.DataFrame, *columns: pl.Expr) -> pl.DataFrame:
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


def checked_records(
    files: Sequence[Path], required: Sequence[str], layout: str
) -> Iterator[tuple[Path, pl.DataFrame]]:
    """Each JSON-lines file with its records, checked for the ``layout``'s required fields."""
    for file in files:
        frame = read_json_lines(file)
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
        typed_select(
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
        for file, frame in checked_records(files, PACKED_REQUIRED, "packed_lengths")
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
        typed_select(
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
        for file, frame in checked_records(files, REWARD_REQUIRED, "reward_timings")
    ]
    return pl.concat(frames).sort("step", "rank")


#: the share of responses that must sit at the longest length for it to count as the cap
CAP_MIN_SHARE = 0.01
#: and how many of them at least (one response is 1% of 100: chance, not a cap)
CAP_MIN_COUNT = 2


@dataclass(frozen=True)
class CapChoice:
    """The rollout's max response length the statistics use, and where it comes from.

    ``source``: ``"given"`` (``--cap``), ``"inferred"`` (at least :data:`CAP_MIN_SHARE` of the
    responses, and :data:`CAP_MIN_COUNT`, share the longest length: generation stopped there) or
    None (no cap: none given, none inferred). ``longest``, ``n_at_longest`` and ``n_responses``
    describe the responses it was judged on (validation rollouts left out, as in the statistics).
    """

    value: int | None
    source: str | None
    longest: int | None
    n_at_longest: int
    n_responses: int

    @property
    def share_at_longest(self) -> float | None:
        """The share of responses at the longest length (None without responses)."""
        return self.n_at_longest / self.n_responses if self.n_responses else None

    @property
    def label(self) -> str | None:
        """``cap_source`` in the tables: ``given`` or ``inferred: 15.0% of responses at …``."""
        if self.source == "inferred":
            return f"inferred: {self.share_at_longest:.1%} of responses at the maximum"
        return self.source

    def text(self) -> str:
        """One line for the terminal and notes: what the "at cap" column means here."""
        if self.value is not None:
            return f"cap {self.value} ({self.label})"
        if self.longest is None:
            return "no cap: none given and no responses"
        share = self.share_at_longest or 0.0
        return (
            f'no cap ("at cap" left blank): none given (--cap), and the longest response '
            f"({self.longest:,} tokens) is {self.n_at_longest:,} of {self.n_responses:,} "
            f"({share:.2%}), under the {CAP_MIN_SHARE:.0%} (and {CAP_MIN_COUNT} responses) "
            "that marks a cap"
        )


def resolve_cap(
    responses: pl.DataFrame, cap: int | None = None, *, validate: bool = False
) -> CapChoice:
    """The cap to use: ``cap`` when given, else inferred from the responses (see CapChoice).

    A rollout stops every response at its max length, so a real cap shows as a pile-up at the
    longest length (13–27% of rllm's responses sit at 16,000); uncapped lengths have one or two
    responses at their maximum. ``validate``: judge on validation rollouts too.
    """
    rows = responses if validate else responses.filter(~pl.col("validate"))
    lengths = rows["output_len"].drop_nulls()
    longest = cast("int | None", lengths.max()) if lengths.len() else None
    n_at = int((lengths == longest).sum()) if longest is not None else 0
    piled_up = n_at >= CAP_MIN_COUNT and n_at >= CAP_MIN_SHARE * rows.height
    source = "given" if cap is not None else "inferred" if piled_up else None
    if cap is None and piled_up:
        cap = longest
    return CapChoice(
        value=None if cap is None else int(cap),
        source=source,
        longest=longest,
        n_at_longest=n_at,
        n_responses=rows.height,
    )


def length_stats(
    responses: pl.DataFrame, *, cap: int | CapChoice | None = None, validate: bool = False
) -> pl.DataFrame:
    """Per-step statistics of response length.

    Count, mean, p50, p90, p99, max, max/mean, coefficient of variation, and the fraction at the
    length cap (``frac_at_cap``: responses at or over ``cap``, the rollout's max response length;
    without one it is inferred by :func:`resolve_cap`, and null where there is none), with the
    cap used (``cap``) and where it came from (``cap_source``: ``given`` or ``inferred: …``).
    Percentiles are linear-interpolated (numpy's default). Validation rollouts are left out
    unless ``validate``.
    """
    rows = responses if validate else responses.filter(~pl.col("validate"))
    choice = cap if isinstance(cap, CapChoice) else resolve_cap(rows, cap, validate=True)
    length = pl.col("output_len").cast(pl.Float64)
    at_cap = (
        (pl.col("output_len") >= choice.value).mean()
        if choice.value is not None
        else pl.lit(None, dtype=pl.Float64)
    )
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
            at_cap.alias("frac_at_cap"),
            pl.col("output_len").sum().alias("tokens"),
        )
        .with_columns(
            (pl.col("max") / pl.col("mean")).alias("max_over_mean"),
            pl.lit(choice.value, dtype=pl.Int64).alias("cap"),
            pl.lit(choice.label, dtype=pl.String).alias("cap_source"),
        )
        .sort("step")
    )


def step_coverage(
    length_steps: Iterable[int], run_steps: Iterable[int], *, selected: bool = False
) -> list[str]:
    """Warnings, naming the steps, where length records and a run's steps do not match.

    Length records of steps the run lacks have no generation to join (no straggler p90 tail,
    no energy per token); run steps without records have no lengths. ``selected``: the run's
    steps are a ``--steps`` selection (said in the warning). Steps counted differently (the
    run's payload-less step ranges numbered 0, 1, … against VeRL's 1, 2, …) are pointed out.
    """
    from ..step_spec import steps_text

    have, run = sorted(set(length_steps)), sorted(set(run_steps))
    extra = [s for s in have if s not in set(run)]
    lacking = [s for s in run if s not in set(have)]
    scope = "selected steps" if selected else "steps"
    warnings = []
    if extra:
        shift = have[0] - run[0] if run and len(have) == len(run) else 0
        hint = (
            f"; they are the run's steps shifted by {shift:+d} (a run whose step ranges carry "
            "no number is counted from 0 by analyze, VeRL counts from 1): steps are matched "
            "by number, never shifted"
            if shift and [s - shift for s in have] == run
            else ""
        )
        warnings.append(
            f"length records for step(s) {steps_text(extra)} have no step in the run (its "
            f"{scope}: {steps_text(run) or 'none'}): no straggler p90 tail or energy per "
            f"token for them{hint}"
        )
    if lacking:
        warnings.append(
            f"the run's step(s) {steps_text(lacking)} have no length records (records for "
            f"steps {steps_text(have)}): no lengths, p90 tail or energy per token for them"
        )
    return warnings


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
