"""``make bench``: ``analyze`` vs the parallel scan floor vs NVIDIA's ``nvtxkernsum``, by size.

Cases (GPU operations; ``BENCH_SIZES=100000,1000000`` for a quick run, default 100k, 1M, 10M; and
``BENCH_STEPS`` steps at 1M operations, default 1000, ``BENCH_STEPS=0`` to skip): synthetic
8-rank exports kept in bench_out/ (10 steps; from 2M operations up, overlaid copies of the 1M
export, :mod:`bench.scale`). Each case is measured in one run, as whole processes under GNU time
(wall seconds, peak RSS), ``--repeat`` times interleaved (medians reported):

  a. the parallel scan floor: the columns ``analyze`` reads, as rowid slices on every core
     (:func:`bench.read_one.read_parallel`);
  b. ``nvtx-phases analyze`` as users run it (tables, figures, summary);
  b'. ``nvtx-phases analyze --no-figures``;
  c. ``nsys stats -r nvtxkernsum`` on a copy of the same file (when nsys is installed; once per
     case from 5M operations up, where one run takes minutes);
  d'. ``nvtx-phases analyze --no-figures`` on the same export as a parquetdir (what ``nsys export
     --type parquetdir`` writes; converted once with
     :func:`nvtx_phases.analysis.read.convert.sqlite_to_parquetdir`, kept in bench_out/), beside
     b' (``BENCH_PARQUETDIR=0`` skips it).

Then start-up (a 3-step sample end to end, b and b'), and ``analyze`` on the largest export under
a hard memory cap (``BENCH_MEM_CAP_MB``, default 2560): by default, and with every operation held
at once (``--chunk-ops`` above the count: loading naively). Writes bench_out/bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nvtx_phases.analysis.normalize.events import OP_TABLES
from nvtx_phases.analysis.read.convert import sqlite_to_parquetdir
from nvtx_phases.analysis.read.parquetdir import is_parquetdir
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from rich.console import Console

from bench.memcap import Cap, memory_cap
from bench.report import print_results
from bench.scale import replicate

OUT = Path("bench_out")
RANKS, STEPS, GPU_PHASES = 8, 10, 5
#: bigger exports are overlaid copies of this one (the generator holds a run in memory)
GENERATE_MAX = 1_000_000
#: the small trace of the start-up measurement
SMALL = Path("traces_sample/grpo_synthetic.sqlite")
#: From this many operations on, ``nsys stats`` runs once per case (one run takes minutes).
NSYS_ONCE_FROM = 5_000_000


def check_export(path: Path) -> Path:
    """``path``, after checking that no GPU operation in it ends before it starts.

    An export kept from an older generator once had two thirds of its kernels backwards (at
    2,500 kernels per phase), which every timing here would silently have been measured on.
    """
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master")}
        backwards = sum(
            con.execute(f"SELECT COUNT(*) FROM {spec.name} WHERE end < start").fetchone()[0]
            for spec in OP_TABLES.values()  # the tables analyze reads operations from
            if spec.name in tables
        )
    if backwards:
        raise SystemExit(f"{path}: {backwards:,} operations end before they start; delete it")
    return path


def export_for(n_ops: int, steps: int = STEPS) -> Path:
    """A synthetic export with about ``n_ops`` GPU operations (made once, then reused)."""
    name = f"bench_{n_ops}.sqlite" if steps == STEPS else f"bench_{n_ops}_steps{steps}.sqlite"
    path = OUT / name
    if path.exists():
        return check_export(path)
    if n_ops > GENERATE_MAX and steps == STEPS:
        return replicate(export_for(GENERATE_MAX), path, n_ops // GENERATE_MAX)
    kernels = max(4, n_ops // (RANKS * steps * GPU_PHASES))
    cfg = SynthConfig(
        steps=steps, ranks=RANKS, kernels_per_phase=kernels, power=False, lengths=False
    )
    generate(path, cfg, with_truth=False)
    return check_export(path)


def parquetdir_for(path: Path) -> tuple[Path, float | None]:
    """The export as a parquetdir beside it (converted once), and the conversion's seconds."""
    target = path.with_name(f"{path.stem}_pqtdir")
    if is_parquetdir(target):
        return target, None
    began = time.perf_counter()
    sqlite_to_parquetdir(path, target)
    return target, time.perf_counter() - began


def folder_mb(folder: Path) -> float:
    """The size of every file in ``folder``, in MB."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


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
            raise RuntimeError(f"{' '.join(command[:5])} failed: {done.stderr[-500:]}")
        fields = Path(report.name).read_text().split()
    wall, rss_kb = fields[-2:] if len(fields) >= 2 else ("nan", "0")
    return {"wall_s": float(wall), "peak_rss_mb": int(rss_kb) / 1024, "returncode": done.returncode}


def analyze_command(path: Path, out: str, *extra: str) -> list[str]:
    """``nvtx-phases analyze`` on one export, quiet (figures unless ``--no-figures`` in extra)."""
    return [
        sys.executable,
        "-m",
        "nvtx_phases.analysis.cli",
        "analyze",
        str(path),
        "--out",
        out,
        "-q",
        *extra,
    ]


def nsys_command(nsys: str, copy: Path, out: str) -> list[str]:
    """``nsys stats -r nvtxkernsum`` on ``copy`` (it may index the file: never the original)."""
    return [
        nsys,
        "stats",
        "-q",
        "--force-overwrite",
        "true",
        "-r",
        "nvtxkernsum",
        "-f",
        "csv",
        "-o",
        out,
        str(copy),
    ]


def _medians(runs: dict[str, list[dict]]) -> dict:
    return {
        name: {
            "median_wall_s": statistics.median(r["wall_s"] for r in values),
            "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in values),
            "max_peak_rss_mb": max(r["peak_rss_mb"] for r in values),
            "runs": values,
        }
        for name, values in runs.items()
        if values
    }


def measure(
    path: Path, repeat: int, nsys: str | None, nsys_repeat: int, parquetdir: Path | None = None
) -> dict:
    """Floor, analyze (default, --no-figures, on the ``parquetdir`` copy), nvtxkernsum, interleaved.

    Each is run ``repeat`` times (nvtxkernsum ``nsys_repeat`` times); medians are kept.
    """
    runs: dict[str, list[dict]] = {
        "floor": [],
        "analyze": [],
        "no_figures": [],
        "nsys": [],
        "parquetdir_no_figures": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.sqlite"
        if nsys:
            shutil.copy(path, copy)
        for attempt in range(repeat):
            runs["floor"].append(
                timed([sys.executable, "-m", "bench.read_one", "parallel", str(path)])
            )
            runs["analyze"].append(timed(analyze_command(path, f"{tmp}/a")))
            runs["no_figures"].append(timed(analyze_command(path, f"{tmp}/b", "--no-figures")))
            if parquetdir is not None:
                runs["parquetdir_no_figures"].append(
                    timed(analyze_command(parquetdir, f"{tmp}/d", "--no-figures"))
                )
            if nsys and attempt < nsys_repeat:
                # a fresh name each time: nsys skips reports whose files exist
                runs["nsys"].append(timed(nsys_command(nsys, copy, f"{tmp}/stats{attempt}")))
    return _medians(runs)


def startup(repeat: int) -> dict:
    """A small trace end to end: ``analyze --no-figures`` and default, and a bare interpreter."""
    runs: dict[str, list[dict]] = {"python": [], "no_figures": [], "analyze": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            runs["python"].append(timed([sys.executable, "-c", "import polars"]))
            runs["no_figures"].append(timed(analyze_command(SMALL, f"{tmp}/b", "--no-figures")))
            runs["analyze"].append(timed(analyze_command(SMALL, f"{tmp}/a")))
    return _medians(runs)


def capped_runs(path: Path, n_ops: int, cap_mb: int) -> dict:
    """``analyze --no-figures`` by default and with every operation held at once, under a cap."""
    # --chunk-ops far above the count: one bucket, every operation in memory at once
    modes = {"bucketed": [], "whole": ["--chunk-ops", str(100 * n_ops)]}
    results: dict = {"cap_mb": cap_mb}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in modes.items():
            with memory_cap(cap_mb, f"nvtx-phases-bench-{mode}") as cap:
                if cap is None:
                    return {**results, "unavailable": "no writable memory cgroup (v1 or v2)"}
                command = analyze_command(path, f"{tmp}/{mode}", "--no-figures", *extra)
                run = timed(command, cap=cap, check=False)
                results[mode] = {
                    **run,
                    "completed": run["returncode"] == 0,
                    "oom_killed": cap.oom_killed(),
                    "cgroup_peak_mb": cap.peak_mb(),
                }
    return results


def cases() -> list[tuple[str, int, int]]:
    """(label, operations, steps) from BENCH_SIZES and BENCH_STEPS."""
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "100000,1000000,10000000").split(",")]
    steps = int(os.environ.get("BENCH_STEPS", "1000"))
    found = [(f"{n:,}", n, STEPS) for n in sizes]
    if steps and steps != STEPS:
        found.append((f"1,000,000 × {steps} steps", 1_000_000, steps))
    return found


def main() -> None:
    """Run the benchmark, print the tables and save bench_out/bench.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cap_mb = int(os.environ.get("BENCH_MEM_CAP_MB", "2560"))
    OUT.mkdir(exist_ok=True)
    console = Console(width=max(Console().width, 140))
    nsys = shutil.which("nsys")
    if nsys is None:
        console.print("nsys not on PATH: column c (nsys stats) is left out")
    results: dict = {"cpus": os.cpu_count(), "cases": {}}
    for label, n, steps in cases():
        with console.status(f"{label}: generating (once; kept in {OUT}/)…"):
            path = export_for(n, steps)
        parquet: dict = {}
        if os.environ.get("BENCH_PARQUETDIR", "1") != "0":
            with console.status(f"{label}: converting to a parquetdir (once)…"):
                folder, convert_s = parquetdir_for(path)
            parquet = {"parquetdir_mb": folder_mb(folder), "parquetdir_convert_s": convert_s}
        with console.status(f"{label}: measuring…"):
            nsys_repeat = 1 if n >= NSYS_ONCE_FROM else args.repeat
            results["cases"][label] = {
                "n_ops": n,
                "steps": steps,
                "file_mb": path.stat().st_size / 1e6,
                **parquet,
                **measure(path, args.repeat, nsys, nsys_repeat, folder if parquet else None),
            }
    with console.status("start-up: the 3-step sample…"):
        results["startup"] = startup(max(args.repeat, 5))
    largest = max(n for _, n, _ in cases())
    with console.status(f"{largest:,} operations: analyze under a {cap_mb} MB memory cap…"):
        results["memory_cap"] = {
            "n_ops": largest,
            **capped_runs(export_for(largest), largest, cap_mb),
        }
    print_results(console, results)
    (OUT / "bench.json").write_text(json.dumps(results, indent=1))
    console.print(f"wrote {OUT / 'bench.json'}")


if __name__ == "__main__":
    main()
