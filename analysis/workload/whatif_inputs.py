"""What the what-if bounds are computed from: a run's measurements as :class:`WhatIfInputs`.

From a trace, the driver's window phases per step (steps with a range cut at the capture's end
left out, named in a warning), per-GPU busy time, per-rank generation ends and power; from VeRL's
logged stage times (``phase_times.csv``), the times only. Pure functions over frames, but for
:func:`read_phase_times`, which reads that file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl

from nvtx_phases.naming import STEP  # stdlib only

from ..errors import WorkloadInputError, one_line
from ..frames import int_value
from ..model import PROJECTION, WINDOW, Analysis, RunSummary
from .whatif import WhatIfInputs


def _driver_rows(analysis: Analysis, name: str) -> pl.DataFrame:
    """The window rows (step and the driver's top-level phases) of the process marking steps."""
    import polars as pl

    from ..phase_paths import is_step_phase

    window = analysis.phases.filter(
        (pl.col("attribution") == WINDOW) & pl.col("step").is_not_null()
    )
    marks = window.filter(pl.col("path") == STEP)
    if marks.is_empty():
        raise WorkloadInputError(
            f"{name}: no step range on a thread that launches no GPU work (a driver, as VeRL's "
            "trainer is), and every what-if bound is per step of the driver's phases; mark steps "
            "and phases there (nvtx_phases.marking.step/phase)"
        )
    trace, pid = (
        marks.group_by("trace", "pid")
        .len()
        .sort(["len", "trace", "pid"], descending=[True, False, False])
        .select("trace", "pid")
        .row(0)
    )
    return window.filter(
        (pl.col("trace") == trace)
        & (pl.col("pid") == pid)
        & ((pl.col("path") == STEP) | is_step_phase())
    )


def _without_cut(rows: pl.DataFrame, name: str) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """The driver's ``rows`` without the steps cut at the capture's end, and a line per step.

    Such a step (:func:`~analysis.aggregate.shares.cut_steps`: its ``step`` range or one of its
    phases ends exactly at the capture's end) has no true time, so it is in no bound and not in
    the warm-up check. Every step cut: :class:`~analysis.errors.WorkloadInputError`.
    """
    import polars as pl

    from ..aggregate.shares import cut_steps, is_cut
    from ..aggregate.steps import CUT_WHY
    from ..render.report.whatif import format_seconds

    cut = cut_steps(rows)
    if not cut:
        return rows, ()
    chosen = pl.col("step").is_in(pl.Series(cut, dtype=rows.schema["step"]).implode())
    if rows.filter((pl.col("path") == STEP) & ~chosen).is_empty():
        raise WorkloadInputError(
            f"{name}: every step ({_spec(cut)}) has a range that ends exactly at the end of the "
            f"capture: {CUT_WHY}; no step has a true time, so no what-if bound is given"
        )
    lines = []
    for step in cut:
        in_step = rows.filter(pl.col("step") == step)
        ranges = in_step.filter(is_cut(in_step)).with_columns(_phase_name().alias("phase"))
        pairs = [(p, format_seconds(w / 1e9)) for p, w in ranges.select("phase", "wall_ns").rows()]
        what = (
            f"{pairs[0][0]} range ({pairs[0][1]}) ends"
            if len(pairs) == 1
            else "ranges " + ", ".join(f"{p} ({t})" for p, t in pairs) + " end"
        )
        lines.append(
            f"step {step} left out of every bound and of the warm-up check: its {what} exactly "
            f"at the end of the capture: {CUT_WHY}"
        )
    return rows.filter(~chosen), tuple(lines)


def _phase_name() -> pl.Expr:
    import polars as pl

    return pl.when(pl.col("path") == STEP).then(pl.lit(STEP)).otherwise(pl.col("path").str.slice(5))


def idle_power_total(summary: RunSummary) -> float | None:
    """The run's GPUs' idle power together (W); None when any GPU's baseline is unknown."""
    energy = summary.energy
    if energy is None or not energy.idle_power_w:
        return None
    values = list(energy.idle_power_w.values())
    return None if any(v is None for v in values) else float(sum(v for v in values if v))


def inputs_from_analysis(
    analysis: Analysis, lengths_stats: pl.DataFrame | None = None, *, name: str = "run"
) -> WhatIfInputs:
    """The bounds' inputs from an analysis: its driver's window phases, per GPU and per rank.

    Raises :class:`~analysis.errors.WorkloadInputError` for a run without step ranges.
    """
    import polars as pl

    from .stragglers import GENERATION_PHASES, generation_tails
    from .whatif import p90_response_tail

    rows, left_out = _without_cut(_driver_rows(analysis, name), name)
    kept = rows["step"].unique().implode()
    times = rows.select(
        "step", _phase_name().alias("phase"), (pl.col("wall_ns") / 1e9).alias("seconds")
    )
    keys = rows.select("trace", "pid", "step", "path")
    busy = analysis.phase_devices.join(keys, on=["trace", "pid", "step", "path"], how="semi")
    busy = busy.select(
        "step",
        _phase_name().alias("phase"),
        "device",
        (pl.col("gpu_busy_ns") / 1e9).alias("busy_s"),
    )
    projected = analysis.phases.filter(
        (pl.col("attribution") == PROJECTION) & pl.col("canonical").is_in(GENERATION_PHASES)
    )["pid"]
    tails = generation_tails(analysis, lengths_stats).filter(
        pl.col("pid").is_in(projected.implode()) & pl.col("step").is_in(kept)
    )
    p90 = None
    if lengths_stats is not None:
        p90 = p90_response_tail(times, lengths_stats)
        if "tail_after_p90_ns" in tails.columns:  # the straggler table's own estimate
            p90 = tails.group_by("step").agg(
                (pl.col("tail_after_p90_ns").first() / 1e9).alias("tail_s")
            )
    gap = rows.filter(pl.col("path") == STEP).select("step", "gap_energy_j")
    trace, pid = rows.select("trace", "pid").row(0)
    pools, pools_missing = _pool_work(analysis, rows)
    return WhatIfInputs(
        pools=pools,
        pools_missing=pools_missing,
        times=times,
        busy=None if busy.is_empty() else busy,
        rank_ends=None if tails.is_empty() else tails.select("step", "pid", "gen_end_ns"),
        p90_tail=p90,
        gap_energy=None if gap["gap_energy_j"].is_null().all() else gap,
        idle_power_w=idle_power_total(analysis.summary),
        source=f"{name}: window phases of {trace} pid {pid}",
        left_out=left_out,
    )


def _pool_work(analysis: Analysis, rows: pl.DataFrame) -> tuple[pl.DataFrame | None, str | None]:
    """``balanced_pools``' inputs: per trainer step, each pool's busy GPU time and GPUs.

    The trainer pool is the driver's (``rows``: its step rows); the rollout pool the one other
    pool with GPUs. Its busy GPU time is that of its top-level window ranges (the rollouter's
    versions) over the run, spread evenly over the trainer steps. ``(None, None)`` for a run
    without pools; ``(None, why)`` where the bound cannot be given.
    """
    import polars as pl

    if analysis.pools is None or "pool" not in rows.columns:
        return None, None
    trainer = rows["pool"].drop_nulls().unique().to_list()
    gpus = dict(zip(analysis.pools["pool"], analysis.pools["n_devices"], strict=True))
    others = [p for p in gpus if p not in trainer and gpus[p] and p != "unpooled"]
    if len(trainer) != 1 or len(others) != 1:
        return None, (
            f"needs two GPU pools with GPUs, the trainer's and one other (pools: "
            f"{', '.join(f'{p} ({n} GPUs)' for p, n in gpus.items())})"
        )
    rollout = others[0]
    top = analysis.phases.filter(
        (pl.col("attribution") == WINDOW) & (pl.col("pool") == rollout) & (pl.col("level") == 0)
    )
    if top.is_empty() or top["gpu_busy_ns"].null_count():
        return None, f"the {rollout} pool's GPU work was not captured (or it marks no phase)"
    steps = rows.filter(pl.col("path") == STEP)
    per_step = int_value(top["gpu_busy_ns"].sum()) / 1e9 / steps.height
    return (
        steps.select(
            "step",
            (pl.col("gpu_busy_ns") / 1e9).alias("trainer_busy_s"),
            pl.lit(gpus[trainer[0]], pl.Int64).alias("trainer_gpus"),
            pl.lit(per_step, pl.Float64).alias("rollout_busy_s"),
            pl.lit(gpus[rollout], pl.Int64).alias("rollout_gpus"),
        ),
        None,
    )


def inputs_from_phase_times(
    frame: pl.DataFrame, lengths_stats: pl.DataFrame | None = None, *, name: str = "phase_times"
) -> WhatIfInputs:
    """The bounds' inputs from a ``phase_times.csv`` (:data:`PHASE_TIMES_SCHEMA`): times only.

    VeRL's trainer stages (gen, reward, old_log_prob, …) are the step's children; other names
    (timers nested in a stage) are left out. Raises :class:`~analysis.errors.WorkloadInputError`
    for missing or null values, a step or phase given twice, or no ``step`` rows.
    """
    import polars as pl

    from nvtx_phases.naming import VERL_TRAINER_PHASES

    from .verl_logs import summed_steps
    from .whatif import PHASE_TIMES_SCHEMA, p90_response_tail

    missing = [c for c in PHASE_TIMES_SCHEMA if c not in frame.columns]
    if missing:
        raise WorkloadInputError(f"{name}: no column(s) {', '.join(missing)}")
    summed = tuple(summed_steps(frame))
    frame = frame.select(*PHASE_TIMES_SCHEMA)
    if frame.null_count().sum_horizontal().item() or (frame["seconds"] < 0).any():
        raise WorkloadInputError(f"{name}: empty or negative values in step, phase or seconds")
    twice = frame.filter(frame.select("step", "phase").is_duplicated())
    if twice.height:
        step, phase = twice.row(0)[:2]
        raise WorkloadInputError(f"{name}: step {step} has phase {phase!r} twice")
    if frame.filter(pl.col("phase") == STEP).is_empty():
        raise WorkloadInputError(
            f"{name}: no rows of phase 'step' (the step's own time; `nvtx-phases logs` writes "
            "one for every step)"
        )
    times = frame.filter(pl.col("phase").is_in(VERL_TRAINER_PHASES))
    p90 = None if lengths_stats is None else p90_response_tail(times, lengths_stats)
    source = f"{name}: logged stage times"
    if summed:
        source += (
            f"; no step timer in steps {_spec(list(summed))} (VeRL 0.1 logs none): their step "
            "time is the sum of their stage timers, the time between stages not seen"
        )
    return WhatIfInputs(times, None, None, p90, None, None, source=source, summed_steps=summed)


def _spec(steps: list[int]) -> str:
    """``steps`` as a ``--steps`` value without spaces (``2:5,7``)."""
    from ..step_spec import steps_text

    return steps_text(steps).replace(", ", ",")


def select_times(inp: WhatIfInputs, steps: str) -> WhatIfInputs:
    """``inp`` (logged stage times) restricted to the steps the ``--steps`` spec ``steps`` picks.

    Raises :class:`~analysis.errors.InputError` for a bad spec or one that matches no step.
    """
    import polars as pl

    from ..errors import InputError
    from ..step_spec import parse_steps

    spec = parse_steps(steps)
    have = sorted(inp.times["step"].unique().to_list())
    chosen = spec.picks(have)
    if not chosen:
        raise InputError(
            f"--steps {spec.text!r} matches no step of this log (steps available: {_spec(have)})"
        )
    return dataclasses.replace(
        inp,
        times=inp.times.filter(pl.col("step").is_in(chosen)),
        p90_tail=None
        if inp.p90_tail is None
        else inp.p90_tail.filter(pl.col("step").is_in(chosen)),
        summed_steps=tuple(s for s in inp.summed_steps if s in chosen),
    )


def dominance_warnings(times: pl.DataFrame) -> list[str]:
    """A warning naming the steps that dominate the run's totals and the ``--steps`` without them."""
    import polars as pl

    from ..render.report.whatif import format_seconds
    from .whatif_pipeline import DOMINANT_FACTOR, dominant_steps

    steps = times.filter(pl.col("phase") == STEP).select("step", pl.col("seconds").alias("step_s"))
    found = dominant_steps(steps)
    if found.is_empty():
        return []
    which = ", ".join(
        f"step {r['step']} takes {format_seconds(r['step_s'])}, "
        f"{r['step_s'] / r['others_s']:.0f}× the median of the other steps "
        f"({format_seconds(r['others_s'])})"
        if r["others_s"]
        else f"step {r['step']} takes {format_seconds(r['step_s'])} (the others take 0 s)"
        for r in found.iter_rows(named=True)
    )
    kept = sorted(set(steps["step"].to_list()) - set(found["step"].to_list()))
    return [
        f"{which}: a warm-up or an outlier (≥ {DOMINANT_FACTOR:g}× the others' median) that "
        f"dominates every run total here; `--steps {_spec(kept)}` leaves it out"
    ]


def read_phase_times(path: Path) -> pl.DataFrame:
    """A ``phase_times.csv`` with :data:`~analysis.workload.whatif.PHASE_TIMES_SCHEMA`'s types.

    Its ``source`` column (``nvtx-phases logs`` writes one) is kept where there is one.
    """
    import polars as pl

    from .whatif import PHASE_TIMES_SCHEMA

    try:
        raw = pl.read_csv(path, infer_schema_length=0)
        missing = [c for c in PHASE_TIMES_SCHEMA if c not in raw.columns]
        if missing:
            raise WorkloadInputError(f"{path}: no column(s) {', '.join(missing)}")
        source = ["source"] if "source" in raw.columns else []  # what `logs` writes beside
        return raw.select(
            *(pl.col(c).cast(t, strict=True) for c, t in PHASE_TIMES_SCHEMA.items()), *source
        )
    except pl.exceptions.PolarsError as exc:
        raise WorkloadInputError(
            f"{path}: not a phase_times.csv (step, phase, seconds): {one_line(str(exc))}"
        ) from exc


# --- the job -------------------------------------------------------------------------------------
