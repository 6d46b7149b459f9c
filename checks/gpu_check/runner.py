"""The check's entry: a GPU run (capture, then analysis), a dry run, or a re-analysis."""

from __future__ import annotations

import faulthandler
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from checks.gpu_check.analyze import analyze
from checks.gpu_check.cli import decide_mode, parse_args
from checks.gpu_check.environment import (
    NVML_AVERAGING_NOTE,
    NvmlProbe,
    classify_power_reading,
    environment,
)
from checks.gpu_check.gates import check_interval, check_ranges, check_uuid, gated_checks
from checks.gpu_check.model import (
    DRY_NOTICE,
    FAIL,
    INFO,
    PHASES,
    POWER_FILE,
    RANGES_FILE,
    REPORT_FILE,
    SKIP,
    SYNTH_POWER_FILE,
    Check,
    Config,
    Report,
)
from checks.gpu_check.project import PowerSampler, record_to
from checks.gpu_check.report import jsonable, markdown, print_tables, verdict_line, write_json
from checks.gpu_check.synthetic import (
    SYNTH_GRID_NS,
    check_synthetic_counter,
    synthetic_exact_checks,
    synthetic_reads,
    synthetic_samples,
)
from checks.gpu_check.timeline import read_ranges
from checks.gpu_check.workload import build_workload, run_workload


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Dump every thread's stack and exit the process if the run takes longer than ``seconds``."""
    # sys.__stderr__: the process's own stderr (a test runner's capture has no file descriptor)
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__ or sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_gpu(cfg: Config, torch: Any, report: Report) -> None:
    """Workload with sampler and recorder, then the analysis and checks (a)–(e)."""
    capture_gpu(cfg, torch, report)
    analyze_gpu(cfg, report)


def capture_gpu(cfg: Config, torch: Any, report: Report) -> None:
    """The measured run: ranges.jsonl, power.parquet, and (already) what is known in the JSON.

    The JSON written here lets ``--reanalyze`` redo the analysis elsewhere if it fails here.
    """
    probe = NvmlProbe(report.environment["torch_uuid"])
    report.power_reading = {**probe.facts(), "note": NVML_AVERAGING_NOTE}
    work = build_workload(torch, dry=False)
    report.notes.append(work.description)
    sampler = PowerSampler(interval_s=cfg.interval_s)
    try:
        with record_to(cfg.out / RANGES_FILE):
            sampler.start()
            run_workload(cfg, work, probe=probe.read, mark=probe.read_counter)
    finally:
        sampler.stop()
        sampler.write_parquet(cfg.out / POWER_FILE)
        probe.close()
        report.counter_reads = probe.counter_reads
    report.power_reading["probes"] = probe.readings
    report.power_reading["power_usage_reading"] = classify_power_reading(probe.readings)
    write_json(report, cfg.out / REPORT_FILE)


def analyze_gpu(cfg: Config, report: Report) -> None:
    """Analysis and checks (a)–(e) of a captured run's files in ``cfg.out``."""
    torch_uuid = report.environment.get("torch_uuid")
    ranges = read_ranges(cfg.out / RANGES_FILE)
    report.checks += check_ranges(ranges, cfg.steps)
    if not (cfg.out / POWER_FILE).exists():
        report.checks.append(Check("e", "power samples", FAIL, "the sampler recorded nothing"))
        return
    table, device = analyze(report, cfg, ranges, cfg.out / POWER_FILE, torch_uuid)
    report.checks += gated_checks(report, cfg, table)
    report.checks += [
        check_uuid(device, torch_uuid),
        check_interval(report.sample_interval, cfg),
        Check("info", "clock mapping", INFO, report.clock["method"]),
        Check(
            "info", "NVML power reading", INFO, report.power_reading.get("power_usage_reading", "—")
        ),
    ]


def run_dry(cfg: Config, torch: Any, report: Report) -> None:
    """CPU workload; JSONL checks; the analysis on constructed samples; real checks skipped."""
    work = build_workload(torch, dry=True)
    report.notes.append(work.description)
    with record_to(cfg.out / RANGES_FILE):
        run_workload(cfg, work)
    ranges = read_ranges(cfg.out / RANGES_FILE)
    report.checks += check_ranges(ranges, cfg.steps)
    report.checks += synthetic_exact_checks()
    expected = synthetic_samples(ranges, cfg.out / SYNTH_POWER_FILE)
    report.counter_reads = synthetic_reads(ranges, cfg.out / SYNTH_POWER_FILE)
    synth_cfg = Config(
        out=cfg.out,
        interval_s=SYNTH_GRID_NS / 1e9,
        max_lag_ms=5.0,
        max_median_lag_ms=5.0,
        counter_span_ms=5.0,
    )
    table, _ = analyze(report, synth_cfg, ranges, cfg.out / SYNTH_POWER_FILE, None)
    report.checks.append(check_synthetic_counter(table, expected))
    report.checks += gated_checks(report, synth_cfg, table, prefix="[synthetic] ")
    report.sample_interval = {}  # the constructed grid's, not a sampler's
    for key, name in (
        ("a", "energy on the GPU"),
        ("b", "power order on the GPU"),
        ("c", "clock alignment on the GPU"),
        ("d", "sampler GPU UUID"),
        ("e", "sample interval"),
    ):
        report.checks.append(Check(key, name, SKIP, f"dry run: {cfg.dry_reason}"))
    report.notes.append(
        f"{SYNTH_POWER_FILE} and counter_reads: constructed samples and reads (not measured)"
    )


def main(argv: list[str] | None = None, *, torch: Any = None) -> int:
    """Run the check; 0 when every check passes, 1 otherwise (``torch``: a stand-in, for tests)."""
    cfg = parse_args(argv)
    console = Console(width=160)
    if cfg.reanalyze:
        return finish(console, cfg, reanalyze(cfg))
    if torch is None:
        try:
            import torch
        except ImportError:  # a dry run still works, with a pure-Python workload
            torch = None

    decide_mode(cfg, torch)
    cfg.out.mkdir(parents=True, exist_ok=True)
    for name in (RANGES_FILE, POWER_FILE, SYNTH_POWER_FILE):
        (cfg.out / name).unlink(missing_ok=True)  # the recorder appends: start from nothing
    run_s = cfg.warmup_s + cfg.steps * len(PHASES) * cfg.phase_s * 1.5 + cfg.tail_s
    budget = cfg.timeout_s or run_s + 180
    report = Report(mode="dry" if cfg.dry else "gpu", config={})
    report.config = jsonable(_plain(cfg))
    if cfg.dry:
        console.print(f"[bold yellow]{DRY_NOTICE}[/] ({cfg.dry_reason})")
    with watchdog(budget):
        try:
            report.environment = environment(torch, cfg)
            (run_dry if cfg.dry else run_gpu)(cfg, torch, report)
        except Exception as exc:  # still write what is known, and say what broke
            console.print_exception()
            report.checks.append(
                Check("run", "run completed", FAIL, f"{type(exc).__name__}: {exc}")
            )
    return finish(console, cfg, report)


def reanalyze(cfg: Config) -> Report:
    """The saved report of a GPU run, its checks redone on its files with today's options."""
    saved = json.loads((cfg.out / REPORT_FILE).read_text())
    if saved.get("mode") != "gpu":
        raise SystemExit(f"{cfg.out / REPORT_FILE}: not a GPU run's report; nothing to reanalyze")
    cfg.steps, cfg.interval_s = saved["config"]["steps"], saved["config"]["interval_s"]
    report = Report(mode="gpu", config={**saved["config"], **jsonable(_plain(cfg))})
    report.environment = saved.get("environment", {})
    report.power_reading = saved.get("power_reading", {})
    report.counter_reads = saved.get("counter_reads", [])
    report.notes = [*saved.get("notes", []), "re-analyzed from the saved files (--reanalyze)"]
    try:
        analyze_gpu(cfg, report)
    except Exception as exc:
        report.checks.append(
            Check("run", "analysis completed", FAIL, f"{type(exc).__name__}: {exc}")
        )
    return report


def _plain(cfg: Config) -> dict[str, Any]:
    """Config as JSON-ready values."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}


def finish(console: Console, cfg: Config, report: Report) -> int:
    """Write the JSON and Markdown, print the tables and the verdict; the exit code."""
    verdict = verdict_line(report)
    report.stage = "analyzed"
    write_json(report, cfg.out / REPORT_FILE)
    (cfg.out / "gpu_check.md").write_text(markdown(report, verdict))
    print_tables(console, report)
    console.print(verdict, style="bold green" if report.passed else "bold red", highlight=False)
    return 0 if report.passed else 1
