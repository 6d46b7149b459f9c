"""Output: ``gpu_check.json``, ``gpu_check.md``, the terminal tables and the verdict line."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from checks.gpu_check.edges import EDGE_HOLD
from checks.gpu_check.model import DRY_NOTICE, FAIL, INFO, NOT_RECORDED, PASS, SKIP, Report


def jsonable(value: Any) -> Any:
    """NaN/inf → None, recursively (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def write_json(report: Report, path: Path) -> None:
    """``gpu_check.json``."""
    data = asdict(report)
    data["passed"] = report.passed
    path.write_text(json.dumps(jsonable(data), indent=2, default=str) + "\n")


PHASE_COLUMNS = (
    ("step", "step", "{}"),
    ("phase", "phase", "{}"),
    ("duration_s", "dur s", "{:.3f}"),
    ("energy_counter_j", "E pipeline J", "{:.2f}"),
    ("energy_reads_j", "E reads J", "{:.2f}"),
    ("rel_diff_reads", "Δ reads", "{:+.2%}"),
    ("tol_reads_j", "tol J", "{:.1f}"),
    ("energy_integrated_j", "E power J", "{:.2f}"),
    ("rel_diff", "Δ power", "{:+.1%}"),
    ("rel_diff_power_shifted", "Δ power shifted", "{:+.1%}"),
    ("mean_power_counter_w", "P mean W", "{:.1f}"),
    ("mean_sampled_power_w", "P samples W", "{:.1f}"),
    ("n_samples", "n", "{}"),
)
READ_COLUMNS = ("step", "phase", "at", "energy_mj", "read_ms", "offset_ms", "window_ms")


def _fmt(fmt: str, value: Any) -> str:
    return "—" if value is None else fmt.format(value)


def gate_notes(report: Report) -> list[str]:
    """What each gate compares, and why its tolerance is what it is (for ``gpu_check.md``)."""
    cfg, ref = report.config, report.reference
    period = ref.get("counter_period", "—")
    tol_median, tol_each = ref.get("lag_tolerances_ms") or (None, None)
    pct = lambda key: "—" if cfg.get(key) is None else f"{cfg[key]:.0%}"  # noqa: E731
    return [
        "(a) E pipeline: the project's counter path (analysis.energy.samples, power_source "
        "nvml-counter): the sampler's energy-counter samples interpolated at the phase's range "
        "ends. E reads: the workload's own nvmlDeviceGetTotalEnergyConsumption reads, taken right "
        "after torch.cuda.synchronize() at the phase's start and end (an independent path).",
        f"(a) per-phase tolerance: the counter changes every {period}, so any read of it is up to "
        "one update stale; at a boundary two reads of it can differ by one update's energy at the "
        "power around the boundary (the higher side's: idle next to update_actor counts at "
        f"update_actor's power). tol = max({pct('tol_phase')} of E reads, that energy at the "
        f"start + at the end). Whole run: within {pct('tol_ref_run')}.",
        "(a) boundary times: a read's value must have been current where the sampler's own "
        "samples say so: after its last sample below that value and before its first above it "
        f"(one process, one clock), within {cfg.get('max_clock_ms')} ms.",
        "(a) E power (integrated sampled power_w) vs the counter per phase is information, not a "
        f"gate: NVML's power reading here is {report.power_reading.get('power_usage_reading', '—')}"
        "; a ~1 s average puts edges ~500 ms late and moves energy across every boundary, which "
        "a time shift only partly undoes (the average also smears). Over the whole run those "
        f"moves cancel: gated at {pct('tol_run')}.",
        f"(c) edge: the crossing of the midpoint between the two phases' levels within "
        f"±{cfg.get('edge_window_s')} s of the boundary after which the new level holds for "
        f"{EDGE_HOLD} samples, the closest to the boundary. Counter-derived power moves in steps "
        f"of the counter's update period ({period}): gated at |median| ≤ "
        f"{_fmt('{:.0f}', tol_median)} ms and each ≤ {_fmt('{:.0f}', tol_each)} ms.",
    ]


def _table(keys: list[str] | tuple[str, ...], rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``rows`` by ``keys``."""
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return lines + ["| " + " | ".join(_fmt("{}", r.get(k)) for k in keys) + " |" for r in rows]


def markdown(report: Report, verdict: str) -> str:
    """``gpu_check.md``: verdict, checks, phase table, boundary lags, counter reads, notes."""
    lines = [
        f"# GPU check ({report.mode})",
        "",
        f"**{verdict}**",
        "",
        "| | check | result | detail |",
        "|---|---|---|---|",
    ]
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    lines += [
        f"| {c.key} | {cell(c.name)} | {c.status} | {cell(c.detail)} |" for c in report.checks
    ]
    if report.phases:
        lines += ["", "## Phases", "", "| " + " | ".join(h for _, h, _ in PHASE_COLUMNS) + " |"]
        lines.append("|" + "---|" * len(PHASE_COLUMNS))
        lines += [
            "| " + " | ".join(_fmt(f, r.get(k)) for k, _, f in PHASE_COLUMNS) + " |"
            for r in report.phases
        ]
    if report.boundaries:
        lines += ["", "## Boundaries (power edge − phase boundary, ms)", ""]
        lines += _table(list(report.boundaries[0]), report.boundaries)
    if report.reference.get("reads"):
        lines += [
            "",
            "## Workload counter reads (offset: ms outside the sampler's span for the value; "
            "window: that span relative to the read, ms)",
            "",
        ]
        lines += _table(READ_COLUMNS, report.reference["reads"])
    elif report.phases:
        lines += ["", f"Workload counter reads: {NOT_RECORDED}."]
    if report.reference:
        lines += ["", "## What the gates measure", ""] + [f"- {n}" for n in gate_notes(report)]
    lines += ["", f"Clock: {report.clock.get('method', '—')}", ""]
    reading = report.power_reading
    if reading.get("probes"):
        lines += [
            f"NVML power reading: {reading.get('power_usage_reading')}. {reading.get('note')}",
            "",
        ]
        lines += _table(
            ("step", "phase", "t_into_phase_s", "usage_w", "instant_w", "average_w"),
            reading["probes"],
        )
        lines.append("")
    lines += [f"- {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def print_tables(console: Console, report: Report) -> None:
    """The phase, boundary and PASS/FAIL tables on the terminal."""
    if report.phases:
        phases = Table(title=f"phases ({report.mode})")
        for _, header, _ in PHASE_COLUMNS:
            phases.add_column(header, justify="right")
        for r in report.phases:
            phases.add_row(*(_fmt(f, r.get(k)) for k, _, f in PHASE_COLUMNS))
        console.print(phases)
    if report.boundaries:
        edges = Table(title="boundaries: power edge − phase boundary (ms)")
        keys = list(report.boundaries[0])
        for key in keys:
            edges.add_column(key, justify="right")
        for r in report.boundaries:
            edges.add_row(*(_fmt("{}", r.get(k)) for k in keys))
        console.print(edges)
    checks = Table(title="checks")
    for header in ("", "check", "result", "detail"):
        checks.add_column(header, overflow="fold")
    style = {PASS: "green", FAIL: "bold red", INFO: "cyan", SKIP: "yellow"}
    for c in report.checks:
        checks.add_row(c.key, escape(c.name), f"[{style[c.status]}]{c.status}[/]", escape(c.detail))
    console.print(checks)


def verdict_line(report: Report) -> str:
    """The one line that says how it went."""
    failed = [f"({c.key}) {c.name}" for c in report.checks if c.status == FAIL]
    gated = sum(c.status in (PASS, FAIL) for c in report.checks)
    if report.mode == "dry":
        head = f"{DRY_NOTICE} ({report.config.get('dry_reason')})"
        return (
            f"{head}; dry checks FAIL: {'; '.join(failed)}"
            if failed
            else f"{head}; dry checks PASS ({gated})"
        )
    skipped = [f"({c.key}) {c.name}" for c in report.checks if c.status == SKIP]
    tail = f"; not evaluated: {'; '.join(skipped)}" if skipped else ""
    return (
        f"gpu_check FAIL: {'; '.join(failed)}{tail}"
        if failed
        else f"gpu_check PASS: all {gated} checks passed{tail}"
    )
