"""``make bench``: analyze vs a bare scan vs NVIDIA's reports, at growing export sizes.

For each size (GPU operations; default 100k, 1M and 10M, ``BENCH_SIZES=100000,1000000`` for a
quick run) it generates a synthetic export once (kept in bench_out/), then measures in the same
run, each as a whole process under GNU time (wall seconds, peak RSS), ``--repeat`` times
(median reported):

  a. bare scan: the needed columns of the big tables into Arrow/Polars (the floor);
  b. ``nvtx-phases analyze`` (tables, no figures);
  c. ``nsys stats -r nvtxkernsum,gpukernsum`` on a copy of the same file (when nsys is
     installed; once per size from 5M operations up, where one run takes minutes).

Then, on the largest export, ``analyze`` twice under a hard memory cap (a memory cgroup,
``BENCH_MEM_CAP_MB``, default 2560): as it runs by default (operations spilled and attributed
in time buckets), and with every operation held at once (``--chunk-ops`` above the count),
which is what loading the export naively costs. Without a writable memory cgroup it says so.

Writes bench_out/bench.json and prints the tables with the ratios b/a and c/b.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analysis.synth.build import SynthConfig, generate
from bench.memcap import Cap, memory_cap

OUT = Path("bench_out")
RANKS, STEPS, GPU_PHASES = 8, 10, 5


def export_for(n_ops: int) -> Path:
    """A synthetic export with about ``n_ops`` GPU operations (generated once, then reused)."""
    kernels = max(4, n_ops // (RANKS * STEPS * GPU_PHASES))
    path = OUT / f"bench_{n_ops}.sqlite"
    if not path.exists():
        cfg = SynthConfig(
            steps=STEPS, ranks=RANKS, kernels_per_phase=kernels, power=False, lengths=False
        )
        generate(path, cfg, with_truth=False)
    return path


def timed(command: list[str], *, cap: Cap | None = None, check: bool = True) -> dict:
    """Wall seconds, peak RSS (MB) and exit status of one whole process (GNU time)."""
    with tempfile.NamedTemporaryFile(suffix=".time") as report:
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%e %M", "-o", report.name, *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=cap.enter if cap is not None else None,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:4])} failed: {done.stderr[-500:]}")
        fields = Path(report.name).read_text().split()
    wall, rss_kb = fields[-2:] if len(fields) >= 2 else ("nan", "0")
    return {
        "wall_s": float(wall),
        "peak_rss_mb": int(rss_kb) / 1024,
        "returncode": done.returncode,
    }


def analyze_command(path: Path, out: str, *extra: str) -> list[str]:
    """``nvtx-phases analyze`` on one export, tables only, quiet."""
    return [
        sys.executable,
        "-m",
        "analysis.cli",
        "analyze",
        str(path),
        "--out",
        out,
        "-q",
        "--no-figures",
        *extra,
    ]


def measure(path: Path, repeat: int, nsys: str | None, nsys_repeat: int) -> dict:
    """The three measurements on one export, interleaved ``repeat`` times."""
    runs: dict[str, list[dict]] = {"scan": [], "analyze": [], "nsys_stats": []}
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(repeat):
            runs["scan"].append(timed([sys.executable, "-m", "bench.read_one", "adbc", str(path)]))
            runs["analyze"].append(timed(analyze_command(path, tmp)))
            if nsys and attempt < nsys_repeat:
                copy = Path(tmp) / "copy.sqlite"
                shutil.copy(path, copy)
                runs["nsys_stats"].append(
                    timed(
                        [
                            nsys,
                            "stats",
                            "-q",
                            "--force-overwrite",
                            "true",
                            "-r",
                            "nvtxkernsum,gpukernsum",
                            "-f",
                            "csv",
                            "-o",
                            # a fresh name each time: nsys skips reports whose files exist
                            f"{tmp}/stats{attempt}",
                            str(copy),
                        ]
                    )
                )
    return {
        name: {
            "median_wall_s": statistics.median(r["wall_s"] for r in values),
            "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in values),
            "runs": values,
        }
        for name, values in runs.items()
        if values
    }


#: From this many operations on, ``nsys stats`` runs once per size (one run takes minutes).
NSYS_ONCE_FROM = 5_000_000


def capped_runs(path: Path, n_ops: int, cap_mb: int) -> dict:
    """``analyze`` by default and with every operation held at once, each under ``cap_mb``."""
    # --chunk-ops far above the count: one bucket, every operation in memory at once
    modes = {"bucketed": [], "whole": ["--chunk-ops", str(100 * n_ops)]}
    results: dict = {"cap_mb": cap_mb}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in modes.items():
            with memory_cap(cap_mb, f"nvtx-phases-bench-{mode}") as cap:
                if cap is None:
                    return {**results, "unavailable": "no writable memory cgroup (v1 or v2)"}
                run = timed(analyze_command(path, f"{tmp}/{mode}", *extra), cap=cap, check=False)
                results[mode] = {
                    **run,
                    "completed": run["returncode"] == 0,
                    "oom_killed": cap.oom_killed(),
                    "cgroup_peak_mb": cap.peak_mb(),
                }
    return results


def main() -> None:
    """Run the benchmark and print/save the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "100000,1000000,10000000").split(",")]
    cap_mb = int(os.environ.get("BENCH_MEM_CAP_MB", "2560"))
    OUT.mkdir(exist_ok=True)
    console = Console(width=max(Console().width, 120))
    nsys = shutil.which("nsys")
    if nsys is None:
        console.print("nsys not on PATH: column c (nsys stats) is left out")
    results: dict = {}
    for n in sizes:
        with console.status(f"{n:,} operations: generating (once; kept in {OUT}/)…"):
            path = export_for(n)
        with console.status(f"{n:,} operations: measuring…"):
            nsys_repeat = 1 if n >= NSYS_ONCE_FROM else args.repeat
            results[n] = {
                "file_mb": path.stat().st_size / 1e6,
                **measure(path, args.repeat, nsys, nsys_repeat),
            }
    table = Table(title="nvtx-phases benchmark (median of runs; whole processes)")
    for column in (
        "GPU ops",
        "file MB",
        "scan s (a)",
        "analyze s (b)",
        "b/a",
        "analyze RSS MB",
        "scan RSS MB",
        "nsys stats s (c)",
        "c/b",
    ):
        table.add_column(column, justify="right")
    for n, r in results.items():
        scan, ana = r["scan"]["median_wall_s"], r["analyze"]["median_wall_s"]
        stats = r.get("nsys_stats", {}).get("median_wall_s")
        r["ratio_analyze_over_scan"] = ana / scan
        r["ratio_nsys_over_analyze"] = stats / ana if stats else None
        table.add_row(
            f"{n:,}",
            f"{r['file_mb']:.0f}",
            f"{scan:.2f}",
            f"{ana:.2f}",
            f"{ana / scan:.2f}",
            f"{r['analyze']['median_peak_rss_mb']:.0f}",
            f"{r['scan']['median_peak_rss_mb']:.0f}",
            "" if stats is None else f"{stats:.2f}",
            "" if stats is None else f"{stats / ana:.1f}",
        )
    console.print(table)
    for small, big in itertools.pairwise(sizes):
        growth = (
            results[big]["analyze"]["median_wall_s"] / results[small]["analyze"]["median_wall_s"]
        )
        console.print(f"analyze time grows {growth:.1f}× from {small:,} to {big:,} operations")
    largest = sizes[-1]
    with console.status(f"{largest:,} operations: analyze under a {cap_mb} MB memory cap…"):
        capped = capped_runs(export_for(largest), largest, cap_mb)
    results["memory_cap"] = {"n_ops": largest, **capped}
    if "unavailable" in capped:
        console.print(f"memory cap: {capped['unavailable']}; capped runs skipped")
    else:
        cap_table = Table(title=f"{largest:,} operations under a {cap_mb} MB memory cap (cgroup)")
        for column in ("analyze", "completed", "wall s", "peak RSS MB", "OOM-killed"):
            cap_table.add_column(column, justify="right")
        for mode, label in (
            ("bucketed", "default (spilled, time buckets)"),
            ("whole", "every operation at once (naive)"),
        ):
            run = capped[mode]
            cap_table.add_row(
                label,
                "yes" if run["completed"] else f"no (exit {run['returncode']})",
                f"{run['wall_s']:.2f}",
                f"{run['peak_rss_mb']:.0f}",
                "yes" if run["oom_killed"] else "no",
            )
        console.print(cap_table)
    (OUT / "bench.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))
    console.print(f"wrote {OUT / 'bench.json'}")


if __name__ == "__main__":
    main()
