"""Compare SQLite→Arrow readers on one synthetic export; baseline: stdlib row-by-row cursor.

``python -m bench.readers [--kernels-per-phase N] [--repeat R]`` writes bench_out/readers.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from nvtx_phases.analysis.synth.build import SynthConfig, generate
from rich.console import Console
from rich.table import Table

OUT = Path("bench_out")


def run_engine(engine: str, path: Path) -> dict:
    """Run one engine in a fresh process; its JSON result."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.read_one", engine, str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Generate the export (once), run every engine, print and save the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels-per-phase", type=int, default=2500)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=max(Console().width, 120))
    OUT.mkdir(exist_ok=True)
    export = OUT / f"readers_{args.steps}x{args.ranks}x{args.kernels_per_phase}.sqlite"
    if not export.exists():
        with console.status(f"generating {export}…"):
            cfg = SynthConfig(
                steps=args.steps, ranks=args.ranks, kernels_per_phase=args.kernels_per_phase
            )
            generate(export, cfg, with_truth=False)
    results: dict[str, list[dict]] = {}
    for _ in range(args.repeat):  # interleave engines so machine drift hits all alike
        for engine in ("sqlite3-rows", "adbc", "adbc-stream", "connectorx", "parallel"):
            results.setdefault(engine, []).append(run_engine(engine, export))
    base = statistics.median(r["wall_s"] for r in results["sqlite3-rows"])
    table = Table(
        title=f"SQLite → Polars readers on {export.name} ({export.stat().st_size / 1e6:.0f} MB)"
    )
    for col in ("engine", "rows", "median s", "vs row cursor", "peak RSS MB"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    summary = {}
    for engine, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        rss = statistics.median(r["peak_rss_mb"] for r in runs)
        summary[engine] = {
            "rows": runs[0]["rows"],
            "median_wall_s": wall,
            "speedup_vs_rows": base / wall,
            "peak_rss_mb": rss,
            "runs": runs,
        }
        table.add_row(
            engine, f"{runs[0]['rows']:,}", f"{wall:.2f}", f"{base / wall:.1f}×", f"{rss:.0f}"
        )
    console.print(table)
    (OUT / "readers.json").write_text(
        json.dumps(
            {"export": str(export), "bytes": export.stat().st_size, "results": summary}, indent=1
        )
    )


if __name__ == "__main__":
    main()
