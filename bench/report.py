"""Print :mod:`bench.run`'s results: cases with ratios, SQLite vs parquetdir, start-up, cap, targets."""

from __future__ import annotations

import itertools

from rich.console import Console
from rich.table import Table

#: issue 14's targets
NSYS_RATIO = {1_000_000: 5.0, 10_000_000: 8.0}
FLOOR_RATIO = 2.0
PEAK_RSS_MB = 2048
STARTUP_S = 0.6
FIGURES_S = 0.5


def _wall(case: dict, name: str) -> float | None:
    return case[name]["median_wall_s"] if name in case else None


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "" if value is None else format(value, spec)


def case_table(results: dict) -> Table:
    """One row per case: the floor, analyze both ways, nvtxkernsum, peak RSS and the ratios."""
    table = Table(title="nvtx-phases benchmark (medians; whole processes, side by side)")
    for column in (
        "case (GPU ops)",
        "file MB",
        "floor s (a)",
        "analyze s (b)",
        "b/a",
        "--no-figures s (b')",
        "figures s (b-b')",
        "analyze peak RSS MB",
        "nvtxkernsum s (c)",
        "c/b",
    ):
        table.add_column(column, justify="right")
    for label, case in results["cases"].items():
        floor, ana, bare = _wall(case, "floor"), _wall(case, "analyze"), _wall(case, "no_figures")
        stats = _wall(case, "nsys")
        assert floor is not None and ana is not None and bare is not None
        case["ratio_analyze_over_floor"] = ana / floor
        case["ratio_nsys_over_analyze"] = stats / ana if stats else None
        case["figures_s"] = ana - bare
        table.add_row(
            label,
            f"{case['file_mb']:.0f}",
            f"{floor:.2f}",
            f"{ana:.2f}",
            f"{ana / floor:.1f}",
            f"{bare:.2f}",
            f"{ana - bare:.2f}",
            f"{case['analyze']['max_peak_rss_mb']:,.0f}",
            _fmt(stats),
            _fmt(stats / ana if stats else None, ".1f"),
        )
    return table


def parquetdir_table(results: dict) -> Table | None:
    """SQLite vs parquetdir input: ``analyze --no-figures`` on each copy of one export."""
    cases = {k: c for k, c in results["cases"].items() if "parquetdir_no_figures" in c}
    if not cases:
        return None
    table = Table(title="the same export as SQLite (b') and as a parquetdir (d'): --no-figures")
    for column in (
        "case (GPU ops)",
        "SQLite MB",
        "parquetdir MB",
        "SQLite s (b')",
        "parquetdir s (d')",
        "d'/b'",
        "SQLite peak RSS MB",
        "parquetdir peak RSS MB",
        "conversion s (once)",
    ):
        table.add_column(column, justify="right")
    for label, case in cases.items():
        sqlite, parquet = _wall(case, "no_figures"), _wall(case, "parquetdir_no_figures")
        assert sqlite is not None and parquet is not None
        case["ratio_parquetdir_over_sqlite"] = parquet / sqlite
        table.add_row(
            label,
            f"{case['file_mb']:.0f}",
            f"{case['parquetdir_mb']:.0f}",
            f"{sqlite:.2f}",
            f"{parquet:.2f}",
            f"{parquet / sqlite:.2f}",
            f"{case['no_figures']['max_peak_rss_mb']:,.0f}",
            f"{case['parquetdir_no_figures']['max_peak_rss_mb']:,.0f}",
            _fmt(case.get("parquetdir_convert_s"), ".1f") or "(kept)",
        )
    return table


def growth_lines(results: dict) -> list[str]:
    """How analyze's time grows with operations (10-step cases) and with steps (at 1M)."""
    by_ops = sorted(
        (c["n_ops"], c["analyze"]["median_wall_s"], c["no_figures"]["median_wall_s"])
        for c in results["cases"].values()
        if c["steps"] == 10
    )
    lines = [
        f"analyze grows {b / a:.1f}× (--no-figures {bb / ab:.1f}×) from {n0:,} to {n1:,} "
        f"operations ({n1 / n0:.0f}× the operations)"
        for (n0, a, ab), (n1, b, bb) in itertools.pairwise(by_ops)
    ]
    per_steps = [c for c in results["cases"].values() if c["steps"] != 10]
    ten = next(
        (c for c in results["cases"].values() if c["steps"] == 10 and c["n_ops"] == 1_000_000),
        None,
    )
    for case in per_steps:
        if ten is not None:
            lines.append(
                f"{case['steps']} steps vs 10 at 1,000,000 operations: analyze "
                f"{case['analyze']['median_wall_s'] / ten['analyze']['median_wall_s']:.2f}×, "
                f"--no-figures "
                f"{case['no_figures']['median_wall_s'] / ten['no_figures']['median_wall_s']:.2f}×"
            )
    return lines


def startup_table(startup: dict) -> Table:
    """The 3-step sample end to end."""
    table = Table(title="start-up: traces_sample/grpo_synthetic.sqlite (3 steps), end to end")
    for column in ("run", "median s", "peak RSS MB"):
        table.add_column(column, justify="right")
    for key, label in (
        ("python", "python -c 'import polars'"),
        ("no_figures", "analyze --no-figures"),
        ("analyze", "analyze (default)"),
    ):
        run = startup[key]
        table.add_row(label, f"{run['median_wall_s']:.2f}", f"{run['median_peak_rss_mb']:.0f}")
    return table


def cap_table(capped: dict) -> Table:
    """``analyze`` on the largest export under the memory cap, bucketed and naive."""
    table = Table(
        title=f"{capped['n_ops']:,} operations under a {capped['cap_mb']} MB memory cap (cgroup)"
    )
    for column in ("analyze --no-figures", "completed", "wall s", "peak RSS MB", "OOM-killed"):
        table.add_column(column, justify="right")
    for mode, label in (
        ("bucketed", "default (spilled, time buckets)"),
        ("whole", "every operation at once (naive)"),
    ):
        run = capped[mode]
        table.add_row(
            label,
            "yes" if run["completed"] else f"no (exit {run['returncode']})",
            f"{run['wall_s']:.2f}",
            f"{run['peak_rss_mb']:.0f}",
            "yes" if run["oom_killed"] else "no",
        )
    return table


def target_lines(results: dict) -> list[str]:
    """Each of issue 14's targets with this run's value: met or not."""
    lines = []
    for case in results["cases"].values():
        n, steps = case["n_ops"], case["steps"]
        if steps != 10:
            continue
        ratio = case.get("ratio_nsys_over_analyze")
        if n in NSYS_RATIO and ratio is not None:
            lines.append(_target(f"nvtxkernsum / analyze at {n:,}", ratio, f"≥ {NSYS_RATIO[n]}"))
        lines.append(
            _target(
                f"analyze / floor at {n:,}", case["ratio_analyze_over_floor"], f"≤ {FLOOR_RATIO:g}"
            )
        )
        lines.append(_target(f"figures at {n:,} (s)", case["figures_s"], f"≤ {FIGURES_S}"))
        if n >= 10_000_000:
            lines.append(
                _target(
                    f"peak RSS at {n:,} (MB)",
                    case["analyze"]["max_peak_rss_mb"],
                    f"≤ {PEAK_RSS_MB}",
                )
            )
    start = results["startup"]
    for key in ("no_figures", "analyze"):
        lines.append(_target(f"start-up, {key} (s)", start[key]["median_wall_s"], f"≤ {STARTUP_S}"))
    return lines


def _target(name: str, value: float, goal: str) -> str:
    bound = float(goal.split()[-1])
    met = value >= bound if goal.startswith("≥") else value <= bound
    return f"{'met    ' if met else 'NOT met'}  {name}: {value:.2f} (target {goal})"


def print_results(console: Console, results: dict) -> None:
    """Print every table and line of a benchmark run."""
    console.print(case_table(results))
    parquet = parquetdir_table(results)
    if parquet is not None:
        console.print(parquet)
    for line in growth_lines(results):
        console.print(line)
    console.print(startup_table(results["startup"]))
    capped = results["memory_cap"]
    if "unavailable" in capped:
        console.print(f"memory cap: {capped['unavailable']}; capped runs skipped")
    else:
        console.print(cap_table(capped))
    console.print(
        f"targets ({results['cpus']} CPUs; a shared machine: compare ratios, not seconds):"
    )
    for line in target_lines(results):
        console.print("  " + line)
