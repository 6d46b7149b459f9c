"""The device step: the driver and its workers captured by nsys once per ``--cuda-graph-trace``.

Runs where the GPU is (or on CPU for the dry run) with the standard library and the repository
alone: no polars, no analysis. Per mode it runs ``nsys profile … python -m
checks.gpu_capture.driver`` (the driver starts each worker under its own nsys), so a mode folder
holds ``driver``, ``rollout`` and ``trainer`` streams: ``.qdstrm`` where nsys has no importer
(the Debian ``nsight-systems-target`` package, see ``../shared/nsys/device-capture.md``) or
``.nsys-rep`` where it has one, plus the driver's JSON files and each process's log. Each mode folder is
packed as ``<mode>.tar.gz`` in ``--out`` (what comes back from the device), beside
``capture.json`` (what ran, versions, exit codes, sizes, durations).
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from checks.gpu_capture.driver import nsys_prefix
from checks.gpu_capture.model import MANIFEST, RANGES_FILE, ROLES, Config
from nvtx_phases.marking import JSONL_ENV

#: Where ``python -m checks.gpu_capture prepare`` puts what the device needs (git-ignored).
ASSETS = Path(".device")
#: The largest file the device hands back (``run``'s limit is 16 MiB a file).
MAX_BACK_BYTES = 16 * 2**20


def target_nsys_from_deb(deb_glob: str, into: Path) -> str | None:
    """The ``nsys`` of a Debian ``nsight-systems-target`` package, unpacked into ``into``."""
    debs = sorted(glob.glob(deb_glob))
    if not debs:
        return None
    found = sorted(into.glob("usr/lib/*/nsight-systems/target-linux-x64/nsys"))
    if not found:
        into.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", debs[-1], str(into)], check=True, timeout=300)
        found = sorted(into.glob("usr/lib/*/nsight-systems/target-linux-x64/nsys"))
    return str(found[0]) if found else None


def locate_nsys(explicit: str, work: Path) -> str:
    """``explicit``, ``$NSYS``, the carried target package, or ``nsys`` on PATH; "" if none."""
    if explicit:
        return explicit
    if os.environ.get("NSYS"):
        return os.environ["NSYS"]
    from_deb = target_nsys_from_deb(str(ASSETS / "nsight-systems-target_*.deb"), work / "nst")
    return from_deb or shutil.which("nsys") or ""


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A process in its own process group (so a hung nsys can be stopped with its children)."""
    with log.open("ab") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip


def finish(proc: subprocess.Popen, deadline: float) -> tuple[int, bool]:
    """Wait until ``deadline`` (monotonic), then stop the group; (exit status, timed out)."""
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), False
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=15)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        code = proc.poll()
        return (-9 if code is None else code), True


def launch(cfg: Config, nsys: str, mode: str, folder: Path) -> dict[str, tuple[int, bool]]:
    """Workers and driver as siblings, each under its own nsys; their (exit status, timed out).

    The FIFOs connect them; the JSONL recorder of every process writes one file.
    """
    pipes = folder / "pipes"
    shutil.rmtree(pipes, ignore_errors=True)
    pipes.mkdir()
    env = {**os.environ, JSONL_ENV: str(folder / RANGES_FILE), "PYTHONUNBUFFERED": "1"}
    common = ["--device", "cpu" if cfg.dry else "cuda", "--sizes", json.dumps(asdict(cfg.sizes))]
    procs = {}
    for role in ROLES:
        os.mkfifo(pipes / f"{role}.in")
        os.mkfifo(pipes / f"{role}.out")
        worker = [sys.executable, "-m", "checks.gpu_capture.worker", role, *common]
        procs[role] = start(nsys_prefix(nsys, mode, folder / role) + worker + ["--pipes", str(pipes)],
                            folder / f"{role}.log", env)  # fmt: skip
    driver = [sys.executable, "-m", "checks.gpu_capture.driver", "--out", str(folder), *common]
    driver += ["--pipes", str(pipes), "--interval-s", str(cfg.interval_s)]
    driver_env = {k: v for k, v in env.items() if k != JSONL_ENV}  # the driver records itself
    procs["driver"] = start(nsys_prefix(nsys, mode, folder / "driver") + driver,
                            folder / "driver.log", driver_env)  # fmt: skip
    deadline = time.monotonic() + cfg.timeout_s
    status = {"driver": finish(procs.pop("driver"), deadline)}
    # a driver that died leaves its workers blocked on their FIFOs: give them little time then
    grace = 60.0 if status["driver"][0] == 0 else 10.0
    status |= {r: finish(p, min(deadline, time.monotonic() + grace)) for r, p in procs.items()}
    shutil.rmtree(pipes, ignore_errors=True)
    return status


def capture_mode(cfg: Config, nsys: str, mode: str, work: Path) -> dict[str, Any]:
    """One capture (driver and workers, each under nsys); its folder packed in ``cfg.out``."""
    folder = work / mode
    started, retried = time.monotonic(), ""
    for attempt in (1, 2):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        status = launch(cfg, nsys, mode, folder)
        streams = [p for p in folder.iterdir() if p.suffix in (".qdstrm", ".nsys-rep")]
        failed = any(code != 0 for code, _ in status.values())
        if not failed or any(t for _, t in status.values()) or len(streams) == 3 or attempt == 2:
            break
        # nsys 2022.4 sometimes fails at once (sem_open: ENOENT) when sessions start together
        retried = "; ".join(_last_line(p) for p in sorted(folder.glob("*.log")))
        print(f"gpu_capture: a capture failed ({retried}); once more", flush=True)
    seconds = time.monotonic() - started
    packed = cfg.out / f"{mode}.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(folder, arcname=mode)
    size = packed.stat().st_size
    return {
        "mode": mode, "exit_status": max(abs(c) for c, _ in status.values()),
        "timed_out": any(t for _, t in status.values()), "processes": status,
        "seconds": round(seconds, 1), "files": sorted(p.name for p in folder.iterdir()),
        "packed": packed.name, "packed_bytes": size,
        "too_big_to_bring_back": size > MAX_BACK_BYTES, "retried_after": retried,
    }  # fmt: skip


def _last_line(log: Path) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return f"{log.stem}: {lines[-1][:160]}" if lines else ""


def environment(nsys: str) -> dict[str, Any]:
    """Versions of what ran: Python, torch, nvtx, nsys; the GPUs nvidia-smi lists."""
    env: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    for name in ("torch", "nvtx"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", None) or _dist_version(name)
        except ImportError:
            env[name] = None
    env["nsys"] = nsys
    env["nsys_version"] = _output([nsys, "--version"]) if nsys else None
    env["nvidia_smi"] = _output(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None
    return env


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _output(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"failed: {exc}"
    return (done.stdout or done.stderr).strip()


def device_step(cfg: Config, work: Path) -> dict[str, Any]:
    """Every mode captured and packed; ``capture.json`` written; the manifest returned."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    nsys = locate_nsys(cfg.nsys, work)
    manifest: dict[str, Any] = {
        "dry": cfg.dry, "dry_reason": cfg.dry_reason, "sizes": asdict(cfg.sizes),
        "environment": environment(nsys), "captures": [],
    }  # fmt: skip
    if not nsys:
        manifest["error"] = "no nsys: pass --nsys, set NSYS, carry .device/ or put nsys on PATH"
    else:
        for mode in cfg.modes:
            print(f"gpu_capture: capturing --cuda-graph-trace={mode} with {nsys}", flush=True)
            manifest["captures"].append(capture_mode(cfg, nsys, mode, work))
    (cfg.out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
