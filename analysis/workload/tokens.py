"""Tokens per step and per phase: the one definition of a phase's token count.

**Rule** (VeRL's, ``compute_timing_metrics`` in ``verl/trainer/ppo/metric_utils.py``): the
generation phase (``gen``) counts the step's *response* tokens; every other phase of the step,
and the step itself, counts *prompt + response* tokens (``perf/total_num_tokens``, what
``perf/throughput`` divides). Tokens are the batch's non-padding tokens: each of the ``n``
responses to a prompt carries its prompt (VeRL repeats the prompt per sample).

**Sources**, per step (:data:`STEP_TOKENS_SCHEMA`):

- *length records* (PolyTrace layout, :func:`~analysis.workload.lengths.read_packed_lengths`):
  prompt tokens = Σ over responses of their prompt's ``input`` length, response tokens = Σ
  ``output``; validation rollouts left out. Exact.
- *VeRL logs* (console or file logger, :mod:`analysis.workload.verl_logs`): VeRL 0.9.1 logs
  ``perf/total_num_tokens`` = Σ over the batch's sequences of ``attention_mask`` (prompt +
  response, padding excluded), and ``prompt_length/mean``, ``response_length/mean`` — the means
  over the same sequences of the same masks' prompt and response parts (``compute_data_metrics``
  on the same batch, after ``_balance_batch``, which only reorders). So the batch holds
  ``N = total ÷ (p̄ + r̄)`` sequences and ``N × r̄`` response tokens. This is checked: where ``N``
  is not a whole number (to float32 precision: VeRL takes the means of float32 tensors) the means
  and the total are not over the same sequences, and response tokens are null with that reason;
  the total is still VeRL's own count. ``N × r̄`` is exact below 2**23 tokens (float32 holds
  the sum and the mean to half a token there); above, the note gives the bound.

Where both sources give a step, the length records' counts are used and the VeRL log's total
compared with them (a warning names the steps that disagree).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ..errors import InputError, WorkloadInputError
from ..model import Analysis

#: the phase that counts response tokens only; every other phase counts prompt + response
GENERATION = "gen"
RESPONSE = "response"
PROMPT_RESPONSE = "prompt+response"
LENGTHS = "lengths"
VERL_LOG = "verl_log"

#: one row per step: its tokens, where they come from, and why any is missing (``note``)
STEP_TOKENS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "response_tokens": pl.Int64(),
    "total_tokens": pl.Int64(),
    "n_sequences": pl.Int64(),
    "source": pl.String(),
    "note": pl.String(),
}
TOTAL_KEY = "perf/total_num_tokens"
RESPONSE_MEAN_KEY = "response_length/mean"
PROMPT_MEAN_KEY = "prompt_length/mean"
#: VeRL's means are of float32 tensors: a sum below this many tokens is exact to half a token
_EXACT_BELOW = 2**23
_F32_EPS = 2.0**-24


def token_rule(canonical: pl.Expr) -> pl.Expr:
    """:data:`RESPONSE` for the generation phase, else :data:`PROMPT_RESPONSE` (the step too)."""
    return (
        pl.when(canonical == GENERATION).then(pl.lit(RESPONSE)).otherwise(pl.lit(PROMPT_RESPONSE))
    )


def rule_tokens(rule: pl.Expr) -> pl.Expr:
    """A row's tokens under its ``rule``, from a :data:`STEP_TOKENS_SCHEMA` row joined to it."""
    return (
        pl.when(rule == RESPONSE).then(pl.col("response_tokens")).otherwise(pl.col("total_tokens"))
    )


def step_tokens_from_lengths(responses: pl.DataFrame) -> pl.DataFrame:
    """Per step, from one row per response (``read_packed_lengths``): exact counts."""
    return (
        responses.filter(~pl.col("validate"))
        .group_by("step")
        .agg(
            pl.col("input_len").sum().alias("prompt_tokens"),
            pl.col("output_len").sum().alias("response_tokens"),
            pl.len().cast(pl.Int64).alias("n_sequences"),
        )
        .with_columns(
            (pl.col("prompt_tokens") + pl.col("response_tokens")).alias("total_tokens"),
            pl.lit(LENGTHS).alias("source"),
            pl.lit(None, dtype=pl.String).alias("note"),
        )
        .select(list(STEP_TOKENS_SCHEMA))
        .cast(STEP_TOKENS_SCHEMA)  # type: ignore[arg-type]
        .sort("step")
    )


def step_tokens_from_verl(values: pl.DataFrame) -> pl.DataFrame:
    """Per step, from a VeRL log's metrics (``latest_values``: ``step, key, value``).

    Steps without ``perf/total_num_tokens`` (a validation-only step 0) have no row. See the
    module's docstring for the derivation of response tokens and its check.
    """
    keys = [TOTAL_KEY, RESPONSE_MEAN_KEY, PROMPT_MEAN_KEY]
    wide = (
        values.filter(pl.col("key").is_in(keys))
        .pivot(on="key", index="step", values="value")
        .filter(pl.col(TOTAL_KEY).is_not_null())
    )
    for key in keys:
        if key not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(key))
    total, r_mean, p_mean = (pl.col(k) for k in keys)
    n_raw = total / (p_mean + r_mean)
    n = n_raw.round()
    whole = (n >= 1) & ((n_raw - n).abs() <= n_raw * 4 * _F32_EPS + 1e-9)
    response = n * r_mean
    note = (
        pl.when(p_mean.is_null() | r_mean.is_null())
        .then(
            pl.lit(
                f"the log has no {PROMPT_MEAN_KEY} or {RESPONSE_MEAN_KEY}: response tokens unknown"
            )
        )
        .when(~whole)
        .then(
            pl.format(
                "{} ÷ ({} + {}) = {} sequences, not a whole number: the means and the total "
                "are not over the same sequences, response tokens unknown",
                pl.lit(TOTAL_KEY),
                pl.lit(PROMPT_MEAN_KEY),
                pl.lit(RESPONSE_MEAN_KEY),
                n_raw.round(3),
            )
        )
        .when(response >= _EXACT_BELOW)
        .then(
            pl.format(
                "response tokens from float32 means: within ±{}",
                (response * _F32_EPS).ceil().cast(pl.Int64),
            )
        )
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    known = whole & p_mean.is_not_null() & r_mean.is_not_null()
    return (
        wide.with_columns(
            total.round().cast(pl.Int64).alias("total_tokens"),
            pl.when(known).then(response.round()).cast(pl.Int64).alias("response_tokens"),
            pl.when(known).then(n).cast(pl.Int64).alias("n_sequences"),
            note.alias("note"),
            pl.lit(VERL_LOG).alias("source"),
        )
        .with_columns((pl.col("total_tokens") - pl.col("response_tokens")).alias("prompt_tokens"))
        .select(list(STEP_TOKENS_SCHEMA))
        .cast(STEP_TOKENS_SCHEMA)  # type: ignore[arg-type]
        .sort("step")
    )


def read_verl_token_logs(paths: Sequence[str | Path]) -> tuple[pl.DataFrame, list[str]]:
    """:func:`step_tokens_from_verl` of VeRL logs (run segments in order; the last wins a step).

    Also a warning naming the steps whose token counts were logged more than once. A file that
    cannot be read, or that logs no ``perf/total_num_tokens``, is a one-line error.
    """
    from .verl_logs import VALIDATION_PREFIXES, latest_values, read_log

    frames = []
    for segment, path in enumerate(paths):
        if not Path(path).is_file():
            raise InputError(f"--verl-log {path}: no such file")
        frame = read_log(path, segment)
        if frame.filter(pl.col("key") == TOTAL_KEY).is_empty():
            raise WorkloadInputError(
                f"--verl-log {path}: no '{TOTAL_KEY}' in any step record (VeRL logs it every "
                "step, 'step:N - … - perf/total_num_tokens:4096 - …' or the file logger's JSON "
                "lines): no token counts from it"
            )
        frames.append(frame)
    log = pl.concat(frames)
    log = log.filter(
        ~pl.any_horizontal(pl.col("key").str.starts_with(p) for p in VALIDATION_PREFIXES)
    )
    repeated = (
        log.filter(pl.col("key") == TOTAL_KEY)
        .group_by("step")
        .agg(pl.struct("segment", "record").n_unique().alias("n"))
        .filter(pl.col("n") > 1)
        .sort("step")["step"]
        .to_list()
    )
    warnings = (
        [
            f"the VeRL log records the token counts of step(s) {', '.join(map(str, repeated))} "
            "more than once: the last record's are used"
        ]
        if repeated
        else []
    )
    return step_tokens_from_verl(latest_values(log)), warnings


@dataclass(frozen=True)
class StepTokens:
    """A run's tokens per step (:data:`STEP_TOKENS_SCHEMA`) and the files they came from.

    ``inputs``: ``(kind, path)`` for the provenance (``lengths``, ``verl_log``); ``warnings``:
    where two sources disagree.
    """

    frame: pl.DataFrame
    inputs: tuple[tuple[str, Path], ...] = ()
    warnings: tuple[str, ...] = field(default=())


def combine(
    lengths: pl.DataFrame | None, logged: pl.DataFrame | None
) -> tuple[pl.DataFrame, list[str]]:
    """Both sources' steps: the length records' where they have the step; the disagreements."""
    if lengths is None or logged is None:
        frame = lengths if lengths is not None else logged
        return (frame if frame is not None else pl.DataFrame(schema=STEP_TOKENS_SCHEMA)), []
    both = lengths.join(logged, on="step", suffix="_log")
    differ = both.filter(pl.col("total_tokens") != pl.col("total_tokens_log")).sort("step")
    warnings = [
        f"step {row['step']}: the length records count {row['total_tokens']:,} prompt + "
        f"response tokens, the VeRL log {row['total_tokens_log']:,}; the length records' "
        "counts are used"
        for row in differ.iter_rows(named=True)
    ]
    rest = logged.join(lengths, on="step", how="anti")
    return pl.concat([lengths, rest]).sort("step"), warnings


def read_step_tokens(
    *, lengths: str | Path | None = None, verl_logs: Sequence[str | Path] = ()
) -> StepTokens | None:
    """The tokens per step of length records (a folder or files) and VeRL logs; None: neither.

    Bad input (no records, no token counts in a log, an unreadable file) is one clear error,
    raised before any analysis when the commands call this first.
    """
    if lengths is None and not verl_logs:
        return None
    from .lengths import read_packed_lengths
    from .records import record_files

    # records of other kinds alone (multi-turn, DAPO) carry no response lengths per step
    packed = record_files([lengths]).packed if lengths is not None else []
    from_lengths = step_tokens_from_lengths(read_packed_lengths(packed)) if packed else None
    if from_lengths is None and not verl_logs:
        return None
    from_logs, repeated = read_verl_token_logs(verl_logs) if verl_logs else (None, [])
    frame, warnings = combine(from_lengths, from_logs)
    warnings = [*repeated, *warnings]
    inputs: tuple[tuple[str, Path], ...] = (
        ((LENGTHS, Path(lengths)),) if packed and lengths is not None else ()
    )
    inputs += tuple((VERL_LOG, Path(p)) for p in verl_logs)
    return StepTokens(frame, inputs, tuple(warnings))


def with_step_tokens(analysis: Analysis, tokens: StepTokens | None) -> Analysis:
    """``analysis`` with ``tokens`` as its ``step_tokens``, their files in its provenance.

    The files are added to the provenance's inputs (kinds ``lengths``, ``verl_log``) and its
    options (``token_sources``); the sources' disagreements to its warnings. ``None``: as it is.
    The result shares ``analysis``'s temporary files: use (and close) only it.
    """
    if tokens is None:
        return analysis
    from ..run.provenance import input_file

    summary = analysis.summary
    provenance = summary.provenance
    if provenance is not None:
        sources: dict[str, list[str]] = {}
        for kind, path in tokens.inputs:
            sources.setdefault(kind, []).append(str(path.absolute()))
        provenance = dataclasses.replace(
            provenance,
            options=provenance.options | {"token_sources": sources},
            inputs=[*provenance.inputs, *(input_file(k, p) for k, p in tokens.inputs)],
        )
    warnings = [*tokens.warnings, *_coverage(tokens.frame, analysis)]
    summary = dataclasses.replace(
        summary, provenance=provenance, warnings=[*summary.warnings, *warnings]
    )
    return dataclasses.replace(analysis, step_tokens=tokens.frame, summary=summary)


def _coverage(frame: pl.DataFrame, analysis: Analysis) -> list[str]:
    """Warnings, naming the steps, where the token counts' steps and the run's differ."""
    from ..run.select import available_steps
    from ..step_spec import steps_text

    run = available_steps(analysis)
    have = sorted(set(frame["step"].to_list()))
    if not run:
        return ["token counts were given, but the run has no steps: no tokens_energy.csv"]
    extra = [s for s in have if s not in set(run)]
    lacking = [s for s in run if s not in set(have)]
    scope = "selected steps" if analysis.summary.selection is not None else "steps"
    warnings = []
    if extra:
        warnings.append(
            f"token counts for step(s) {steps_text(extra)} have no step in the run (its "
            f"{scope}: {steps_text(run)}); steps are matched by number, never shifted"
        )
    if lacking:
        warnings.append(
            f"the run's step(s) {steps_text(lacking)} have no token counts (counts for steps "
            f"{steps_text(have) or 'none'}): no J per token for them"
        )
    return warnings
