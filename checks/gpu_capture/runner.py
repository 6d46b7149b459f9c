"""Command line: ``--step device`` (on the GPU machine), ``--step import`` (here), or both.

The device step imports only the standard library, torch and the capture side of the project
(no polars), so it runs with a GPU machine's system Python; the import step needs this
repository's environment (polars, the analysis, nsys and its ``QdstrmImporter``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from checks import gpu_capture
from checks.gpu_capture.device import ASSETS, device_step
from checks.gpu_capture.model import DRY_NOTICE, MODES, REPORT_JSON, REPORT_MD, Config, Sizes


def parse_args(argv: list[str] | None) -> tuple[Config, str, bool]:
    """Command line → (Config, step, prepare)."""
    p = argparse.ArgumentParser(
        prog="python -m checks.gpu_capture",
        description=(gpu_capture.__doc__ or "").split("\n\n")[0],
        epilog="Device command for a lent GPU: see checks/README.md (gpu_capture).",
    )
    p.add_argument("--out", type=Path, help="folder for everything (device: $OUT)")
    p.add_argument("--step", choices=("all", "device", "import"), default="all",
                   help="device: capture and pack (GPU machine); import: import, analyze and "
                   "check what came back (here); all: both, on this machine (default)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="CPU only (automatic without CUDA)")
    p.add_argument("--steps", type=int, help="training steps (3; dry run: 2)")
    p.add_argument(
        "--modes", default=",".join(MODES), help="--cuda-graph-trace values (graph,node)"
    )
    p.add_argument("--nsys", default="", help="nsys for the capture (default: $NSYS, the "
                   f"carried {ASSETS}/nsight-systems-target_*.deb, nsys on PATH)")  # fmt: skip
    p.add_argument("--interval-s", type=float, default=0.02, help="NVML sampler interval (0.02)")
    p.add_argument("--timeout-s", type=float, default=240.0, help="limit per capture (240)")
    p.add_argument("--tol-events-us", type=float, default=20.0,
                   help="CUDA events − traced GPU span allowed per range (20 µs)")  # fmt: skip
    p.add_argument(
        "--tol-graph",
        type=float,
        default=0.05,
        help="graph vs node: relative slack beyond the replay overhead (0.05)",
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help=f"no run: put what the device needs "
        f"in {ASSETS}/ (apt-get download nsight-systems-target; nvtx==0.2.8 wheel)",
    )
    a = p.parse_args(argv)
    if not a.prepare and a.out is None:
        p.error("--out is required")
    cfg = Config(out=a.out or Path("."), nsys=a.nsys, interval_s=a.interval_s,
                 timeout_s=a.timeout_s, tol_events_ns=round(a.tol_events_us * 1e3),
                 tol_graph=a.tol_graph, modes=tuple(m for m in a.modes.split(",") if m))  # fmt: skip
    bad = [m for m in cfg.modes if m not in MODES]
    if bad:
        p.error(f"--modes: {bad} not in {MODES}")
    cfg.dry = a.dry_run
    cfg.dry_reason = "--dry-run" if a.dry_run else ""
    if not cfg.dry and a.step != "import":
        decide_dry(cfg)
    cfg.sizes = Sizes.dry(a.steps or 2) if cfg.dry else Sizes(steps=a.steps or 3)
    return cfg, a.step, a.prepare


def decide_dry(cfg: Config) -> None:
    """A dry run (with the reason) where torch or CUDA is missing."""
    try:
        import torch
    except ImportError:
        cfg.dry, cfg.dry_reason = True, "torch is not installed (workers hash on the CPU)"
        return
    if not torch.cuda.is_available():
        cfg.dry, cfg.dry_reason = True, "torch.cuda.is_available() is False"


def prepare() -> int:
    """Download the target-only nsys package (required) and an nvtx 0.2.8 for the device."""
    ASSETS.mkdir(exist_ok=True)
    deb = ["apt-get", "download", "nsight-systems-target"]
    # nsys 2022.4 records ranges from nvtx 0.2.8 only (../shared/nsys/README.md); the device's
    # Python is 3.12, for which 0.2.8 has no wheel: its source, built there, is the fallback
    nvtx = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", ".", "nvtx==0.2.8",
            "--python-version", "3.12", "--implementation", "cp", "--platform",
            "manylinux2014_x86_64"]  # fmt: skip
    for cmd, needed in ((deb, True), ([*nvtx, "--only-binary=:all:"], False),
                        ([*nvtx[:7], "--no-binary=:all:"], False)):  # fmt: skip
        print("+ " + " ".join(cmd), flush=True)
        code = subprocess.run(cmd, cwd=ASSETS, check=False).returncode
        if code and needed:
            return 1
        if not code and not needed:
            break
    print(f"{ASSETS}/: " + ", ".join(sorted(p.name for p in ASSETS.iterdir())))
    return 0


def run_import(cfg: Config) -> int:
    """Import step: checks table printed, JSON and Markdown written; 0 when nothing failed."""
    from checks.gpu_capture.analysis_step import import_step, report_data
    from checks.gpu_capture.report import markdown, print_report

    manifest = json.loads((cfg.out / "capture.json").read_text())
    cfg.dry, cfg.dry_reason = bool(manifest.get("dry")), manifest.get("dry_reason", "")
    cfg.sizes = Sizes(**manifest["sizes"])
    checks, runs = import_step(cfg)
    data = report_data(cfg, checks, runs) | {"environment": manifest.get("environment")}
    (cfg.out / REPORT_JSON).write_text(json.dumps(data, indent=1, default=str) + "\n")
    (cfg.out / REPORT_MD).write_text(markdown(data))
    print_report(data)
    return 0 if data["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    """Run the chosen step(s); the exit code."""
    cfg, step, want_prepare = parse_args(argv)
    if want_prepare:
        return prepare()
    if cfg.dry and step != "import":
        print(f"{DRY_NOTICE} ({cfg.dry_reason})", flush=True)
    if step in ("all", "device"):
        if cfg.out.exists() and step == "all":
            for old in cfg.out.glob("*.tar.gz"):
                old.unlink()
        work = Path(tempfile.mkdtemp(prefix="gpu_capture_"))
        try:
            manifest = device_step(cfg, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if step == "device":
            print(json.dumps(manifest["captures"], indent=1))
            return 0 if manifest["captures"] and not manifest.get("error") else 1
    return run_import(cfg)
