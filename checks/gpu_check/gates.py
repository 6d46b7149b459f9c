"""The checks (a)–(e) and the JSONL checks: PASS/FAIL gates with their tolerances, INFO, SKIP."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import polars as pl

from checks.gpu_check.edges import lag_summary
from checks.gpu_check.model import (
    DEFAULT_COUNTER_PERIOD_MS,
    FAIL,
    INFO,
    NOT_RECORDED,
    ORDER,
    PASS,
    PHASES,
    SKIP,
    Check,
    Config,
    Report,
)


def check_reference(report: Report, cfg: Config) -> list[Check]:
    """(a) gates: the pipeline's counter energy vs the workload's own counter reads.

    Per phase, whole run, and whether each read lies where the sampler saw its value (both paths
    on one clock). A run without reads (captured before the check took them): SKIP, not FAIL.
    """
    names = (
        "energy per phase: pipeline (counter) vs workload counter reads",
        "energy whole run: pipeline (counter) vs workload counter reads",
        "counter reads: sampler and workload agree on boundary times",
    )
    if not report.counter_reads:
        return [Check("a", n, SKIP, NOT_RECORDED) for n in names]
    ref = report.reference
    period = ref.get("counter_period", "—")
    rows = [r for r in report.phases if r.get("energy_reads_j") is not None]
    checks = []
    if not rows:
        checks.append(Check("a", names[0], FAIL, "no phase has both its start and end read"))
    else:
        over = [r for r in rows if abs(r["diff_reads_j"]) > r["tol_reads_j"]]
        worst = max(rows, key=lambda r: abs(r["diff_reads_j"]) / r["tol_reads_j"])
        detail = (
            f"{len(rows) - len(over)}/{len(rows)} phases within tol; worst vs its tol: step "
            f"{worst['step']} {worst['phase']} {worst['energy_counter_j']:.2f} J vs "
            f"{worst['energy_reads_j']:.2f} J ({worst['rel_diff_reads']:+.2%}; tol "
            f"{worst['tol_reads_j']:.1f} J); max |diff| "
            f"{max(abs(r['rel_diff_reads']) for r in rows):.2%}; tol = max({cfg.tol_phase:.0%}, "
            f"one counter update ({period}) at each end at the higher power around it)"
        )
        checks.append(Check("a", names[0], FAIL if over else PASS, detail))
    run = ref.get("whole_run") or {}
    if run.get("rel_diff") is None:
        checks.append(Check("a", names[1], FAIL, "first start or last end read missing"))
    else:
        ok = abs(run["rel_diff"]) <= cfg.tol_ref_run
        detail = (
            f"{run['energy_counter_j']:.2f} J vs {run['energy_reads_j']:.2f} J: "
            f"{run['rel_diff']:+.3%}; tol {cfg.tol_ref_run:.0%} (counter resolution at the two "
            f"ends: {run['resolution_j']:.1f} J = {run['resolution_j'] / run['energy_reads_j']:.2%})"
        )
        checks.append(Check("a", names[1], PASS if ok else FAIL, detail))
    align = ref.get("alignment", {})
    if not align.get("measured"):
        checks.append(
            Check("a", names[2], FAIL, f"no read bracketed by samples ({align.get('reads', 0)})")
        )
    else:
        ok = align["max_abs_offset_ms"] <= cfg.max_clock_ms
        shift = align.get("allowed_shift_ms")
        detail = (
            f"{align['measured'] - align['outside']}/{align['measured']} reads inside the span "
            f"where the sampler saw the same counter value; max |offset| "
            f"{align['max_abs_offset_ms']:.1f} ms (tol {cfg.max_clock_ms:g} ms: the sampler stamps "
            f"a sample before its NVML reads); sampler − workload clock shift allowed by all "
            + (f"reads: {shift[0]:+.1f} … {shift[1]:+.1f} ms" if shift else "reads: none")
            + f"; longest read {align['max_read_ms']:.2f} ms"
        )
        checks.append(Check("a", names[2], PASS if ok else FAIL, detail))
    return checks


def check_integrated(report: Report, run: dict[str, Any], cfg: Config) -> list[Check]:
    """(a) integrated sampled power vs counter: per phase INFO (the finding), whole run gated."""
    rows = [r for r in report.phases if r.get("rel_diff") is not None]
    checks = []
    if not rows:
        checks.append(
            Check("a", "energy per phase: integrated power vs counter", INFO, "no phases")
        )
    else:
        worst = max(rows, key=lambda r: abs(r["rel_diff"]))
        shifted = [
            r["rel_diff_power_shifted"] for r in rows if r.get("rel_diff_power_shifted") is not None
        ]
        shift_ms = rows[0].get("power_shift_ms") or 0.0
        lag = report.lag_summary.get("sampled", {}).get("median_ms")
        detail = (
            f"max |diff| {abs(worst['rel_diff']):.1%} (step {worst['step']} {worst['phase']}: "
            f"{worst['energy_integrated_j']:.2f} J vs {worst['energy_counter_j']:.2f} J)"
            + (f"; sampled power edge lag median {lag:+.0f} ms" if lag is not None else "")
            + (
                f"; power moved {shift_ms:+.0f} ms: max |diff| {max(map(abs, shifted)):.1%}"
                if abs(shift_ms) >= 1.0 and shifted
                else ""
            )
            + (
                f"; NVML power reading: {report.power_reading['power_usage_reading']}"
                if report.power_reading.get("power_usage_reading")
                else ""
            )
            + "; per-phase energy must come from the counter (power_source nvml-counter)"
        )
        checks.append(Check("a", "energy per phase: integrated power vs counter", INFO, detail))
    rel = run.get("rel_diff")
    run_ok = rel is not None and abs(rel) <= cfg.tol_run
    run_detail = (
        f"{run.get('energy_integrated_j', 0):.2f} J vs {run.get('energy_counter_j', 0):.2f} J: "
        f"{(rel or 0):+.2%}; tol {cfg.tol_run:.0%}"
    )
    checks.append(
        Check(
            "a",
            "energy whole run: integrated power vs counter",
            PASS if run_ok else FAIL,
            run_detail,
        )
    )
    return checks


def check_ordering(table: pl.DataFrame) -> Check:
    """(b) mean power update_actor > gen > idle in every step (counter-based mean power)."""
    bad, shown = [], []
    for (step_index,), rows in table.group_by("step", maintain_order=True):
        power = dict(zip(rows["phase"], rows["mean_power_counter_w"], strict=True))
        values = [power.get(p) for p in ORDER]
        shown.append(
            f"s{step_index}: " + "/".join("?" if v is None else f"{v:.0f}" for v in values)
        )
        known = [v for v in values if v is not None]
        if len(known) < len(values) or not all(a > b for a, b in itertools.pairwise(known)):
            bad.append(step_index)
    detail = "W update_actor/gen/idle " + "; ".join(shown)
    if bad:
        detail += f"; out of order in step(s) {bad}"
    return Check(
        "b", "power order update_actor > gen > idle", FAIL if bad or not shown else PASS, detail
    )


def lag_tolerances(cfg: Config, period_ms: float) -> tuple[float, float]:
    """(|median|, each) tolerances in ms: given, or the counter period × the configured factors."""
    median = cfg.max_median_lag_ms
    each = cfg.max_lag_ms
    return (
        median if median is not None else cfg.lag_median_periods * period_ms,
        each if each is not None else cfg.lag_max_periods * period_ms,
    )


def check_lag(
    rows: list[dict[str, Any]],
    cfg: Config,
    gated: str,
    informative: str,
    period: tuple[float, str] = (DEFAULT_COUNTER_PERIOD_MS * 1e6, "assumed"),
) -> list[Check]:
    """(c) power edge − phase boundary: gated on ``gated``'s series, the other reported.

    Gate: |median| and every |lag| within the tolerances of :func:`lag_tolerances`; ``period``
    is the counter's update period (ns) and where it came from. The counter's power can only
    place an edge to within about one update period (it moves in steps), plus its derivative's
    span, hence 1.5 periods for the median and 2.5 for any single boundary.
    """
    tol_median, tol_each = lag_tolerances(cfg, period[0] / 1e6)
    derived = cfg.max_lag_ms is None or cfg.max_median_lag_ms is None
    checks = []
    for source, gate in ((gated, True), (informative, False)):
        s = lag_summary(rows, source)
        if s["measured"] == 0:
            status = FAIL if gate else INFO
            detail = f"no measurable edge in {s['boundaries']} boundaries"
        else:
            ok = abs(s["median_ms"]) <= tol_median and s["max_abs_ms"] <= tol_each
            status = (PASS if ok else FAIL) if gate else INFO
            detail = (
                f"median {s['median_ms']:+.1f} ms, max |lag| {s['max_abs_ms']:.1f} ms over "
                f"{s['measured']}/{s['boundaries']} boundaries"
            )
            if gate:
                detail += f"; tol |median| ≤ {tol_median:.0f} ms, each ≤ {tol_each:.0f} ms"
                if derived:
                    detail += (
                        f" ({cfg.lag_median_periods:g} / {cfg.lag_max_periods:g} × the counter's "
                        f"update period, {period[1]})"
                    )
            else:
                detail += " (information: NVML's power reading averages)"
        checks.append(Check("c", f"clock alignment: edge lag of {source} power", status, detail))
    return checks


def check_uuid(sampler_device: str, torch_uuid: str | None) -> Check:
    """(d) the sampler's GPU is torch's GPU."""
    ok = torch_uuid is not None and sampler_device == torch_uuid
    return Check(
        "d",
        "sampler GPU UUID = torch GPU UUID",
        PASS if ok else FAIL,
        f"nvml {sampler_device} vs torch {torch_uuid}",
    )


def check_interval(stats: dict[str, Any], cfg: Config) -> Check:
    """(e) achieved sampling interval close enough to the requested one."""
    req = stats["requested_ms"]
    if "median_ms" not in stats:
        return Check("e", "sample interval", FAIL, f"{stats['samples']} sample(s)")
    ok = (
        stats["median_ms"] <= cfg.interval_median_max * req
        and stats["p95_ms"] <= cfg.interval_p95_max * req
    )
    detail = (
        f"median {stats['median_ms']:.1f} ms, p95 {stats['p95_ms']:.1f} ms vs requested {req:g} ms "
        f"(limits ×{cfg.interval_median_max:g}, ×{cfg.interval_p95_max:g}; {stats['samples']} samples)"
    )
    for key in ("energy_counter_updates", "power_updates"):
        period = stats.get(key, {}).get("median_change_ms")
        if period is not None:
            detail += (
                f"; {key.split('_updates')[0].replace('_', ' ')} changes every {period:.0f} ms"
            )
    return Check("e", "sample interval achieved", PASS if ok else FAIL, detail)


def expected_paths(steps: int) -> Counter[str]:
    """How many ranges of each path the workload records."""
    return Counter({"warmup": 1, "step": steps, **{f"step/{p}": steps for p in PHASES}})


def check_ranges(ranges: pl.DataFrame, steps: int) -> list[Check]:
    """JSONL: ranges written, expected names/paths/steps, each phase nested in its step."""
    got = Counter(ranges["path"].to_list())
    want = expected_paths(steps)
    names_ok = got == want and set(
        ranges.filter(pl.col("path") != "warmup")["step"].to_list()
    ) == set(range(1, steps + 1))
    steps_frame = ranges.filter(pl.col("path") == "step").select(
        "step", pl.col("start_mono_ns").alias("s0"), pl.col("end_mono_ns").alias("s1")
    )
    inside = ranges.filter(pl.col("path").str.starts_with("step/")).join(
        steps_frame, on="step", how="left"
    )
    outside = inside.filter(
        pl.col("s0").is_null()
        | (pl.col("start_mono_ns") < pl.col("s0"))
        | (pl.col("end_mono_ns") > pl.col("s1"))
    )
    return [
        Check(
            "jsonl", "ranges written", PASS if ranges.height else FAIL, f"{ranges.height} ranges"
        ),
        Check(
            "jsonl",
            "names, paths and step indices",
            PASS if names_ok else FAIL,
            ", ".join(f"{k}×{v}" for k, v in sorted(got.items())) or "none",
        ),
        Check(
            "jsonl",
            "each phase nested in its step",
            PASS if outside.is_empty() and inside.height else FAIL,
            f"{inside.height - outside.height}/{inside.height} inside",
        ),
    ]


def gated_checks(report: Report, cfg: Config, table: pl.DataFrame, prefix: str = "") -> list[Check]:
    """(a), (b), (c) on an analyzed run; ``prefix`` labels them (``[synthetic] `` in a dry run)."""
    period = (report.reference["counter_period_ms"] * 1e6, report.reference["counter_period"])
    checks = [
        *check_reference(report, cfg),
        *check_integrated(report, report.whole_run, cfg),
        check_ordering(table),
        *check_lag(report.boundaries, cfg, gated="counter", informative="sampled", period=period),
    ]
    for c in checks:
        c.name = prefix + c.name
    return checks
