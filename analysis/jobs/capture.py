"""Jobs that make traces: profile a command under nsys, write synthetic exports."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import describe_error

if TYPE_CHECKING:
    from nvtx_phases.nsys import Nsys, ProfileOptions, ProfileRun

    from ..synth.async_rl.config import AsyncConfig
    from ..synth.config import SynthConfig
    from ..synth.ray import RayConfig


# --- capture and synthetic runs ------------------------------------------------------------------


def profile_workload(
    command: Sequence[str],
    out: Path,
    *,
    nsys: Nsys,
    options: ProfileOptions,
    power: bool = False,
    timeout_s: float | None = None,
) -> ProfileRun:
    """Run ``command`` under ``nsys`` and export its reports to SQLite into ``out``: ``profile``.

    ``power``: the workload runs inside the NVML sampler (:mod:`nvtx_phases.power_run`), which
    writes ``out/power_<host>.parquet`` where ``analyze`` finds it.
    """
    import socket
    import sys

    from nvtx_phases.nsys import profile

    workload = list(command)
    if power:
        samples = out / f"power_{socket.gethostname()}.parquet"
        workload = [sys.executable, "-m", "nvtx_phases.power_run", "--out", str(samples), "--"]
        workload += command
    return profile(workload, out, options=options, nsys=nsys, timeout_s=timeout_s)


def synthesize(
    out: Path, config: SynthConfig | RayConfig | AsyncConfig, *, truth: bool = True
) -> list[Path]:
    """Write a synthetic GRPO run, a Ray-style or an asynchronous capture: ``synth``.

    A ``RayConfig`` writes the Ray-style capture, an ``AsyncConfig`` the asynchronous one.

    ``truth``: also the ground-truth JSON. Where ``out`` cannot be written: ``OutputError``.
    """
    import sqlite3

    from ..errors import OutputError
    from ..synth import build
    from ..synth.async_rl import AsyncConfig, generate_async
    from ..synth.ray import RayConfig, generate_ray

    try:
        if isinstance(config, AsyncConfig):
            return generate_async(out, config, with_truth=truth)
        if isinstance(config, RayConfig):
            return generate_ray(out, config, with_truth=truth)
        return build.generate(out, config, with_truth=truth)
    except (OSError, sqlite3.Error) as exc:  # where it cannot write: name the output first
        raise OutputError(
            f"{out}: cannot write the synthetic run here ({describe_error(exc)})"
        ) from exc
