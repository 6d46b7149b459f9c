"""``make bench``: analyze vs a bare scan vs NVIDIA's reports, at growing export sizes.

For each size (GPU operations; default 100k and 1M, ``BENCH_SIZES=100000,1000000,10000000`` for
more) it generates a synthetic export once, then measures in the same run, each as a whole
process under GNU time (wall seconds, peak RSS), ``--repeat`` times (median reported):

  a. bare scan: the needed columns of the big tables into Arrow/Polars (the floor);
  b. ``nvtx-phases analyze`` (tables, no figures);
  c. ``nsys stats -r nvtxkernsum,gpukernsum`` on a copy of the same file (when nsys is installed).

Writes bench_out/bench.json and prints a table with the ratios b/a and c/b.
"""

from __future__ import annotations

import argparse
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

from analysis.synth import SynthConfig, generate

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


def timed(command: list[str]) -> dict:
    """Wall seconds and peak RSS (MB) of one whole process (GNU time)."""
    with tempfile.NamedTemporaryFile(suffix=".time") as report:
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%e %M", "-o", report.name, *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:4])} failed: {done.stderr[-500:]}")
        wall, rss_kb = Path(report.name).read_text().split()[-2:]
    return {"wall_s": float(wall), "peak_rss_mb": int(rss_kb) / 1024}


def measure(path: Path, repeat: int, nsys: str | None) -> dict:
    """The three measurements on one export, interleaved ``repeat`` times."""
    runs: dict[str, list[dict]] = {"scan": [], "analyze": [], "nsys_stats": []}
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(repeat):
            runs["scan"].append(timed([sys.executable, "-m", "bench.read_one", "adbc", str(path)]))
            runs["analyze"].append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "nvtx_phases.cli",
                        "analyze",
                        str(path),
                        "--out",
                        tmp,
                        "-q",
                        "--no-figures",
                    ]
                )
            )
            if nsys:
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


def main() -> None:
    """Run the benchmark and print/save the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "100000,1000000").split(",")]
    OUT.mkdir(exist_ok=True)
    console = Console()
    nsys = shutil.which("nsys")
    results = {}
    for n in sizes:
        with console.status(f"{n:,} operations: generating…"):
            path = export_for(n)
        with console.status(f"{n:,} operations: measuring…"):
            results[n] = {"file_mb": path.stat().st_size / 1e6, **measure(path, args.repeat, nsys)}
    table = Table(title="nvtx-phases benchmark (median of runs; whole processes)")
    for column in (
        "GPU ops",
        "file MB",
        "scan s",
        "analyze s",
        "b/a",
        "analyze RSS MB",
        "nsys stats s",
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
            "" if stats is None else f"{stats:.2f}",
            "" if stats is None else f"{stats / ana:.1f}",
        )
    console.print(table)
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        growth = (
            results[last]["analyze"]["median_wall_s"] / results[first]["analyze"]["median_wall_s"]
        )
        console.print(f"analyze time grows {growth:.1f}× for {last / first:.0f}× the operations")
    (OUT / "bench.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
