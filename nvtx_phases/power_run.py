"""Run a command with the NVML power sampler around it.

``python -m nvtx_phases.power_run --out power.parquet -- CMD ...``. Under nsys, this process and
its clock marks are in the same trace as the workload.

The command's exit code is passed on; SIGINT/SIGTERM are forwarded to it and the samples taken
so far are still written.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys

from nvtx_phases.power import PowerSampler


def run(command: list[str], out: str, interval_s: float = 0.05) -> int:
    """Sample power while ``command`` runs; write the Parquet; return the command's exit code."""
    sampler = PowerSampler(interval_s=interval_s).start()
    try:
        child = subprocess.Popen(command)
        forward = lambda signum, _frame: child.send_signal(signum)  # noqa: E731
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        sampler.stop()
        written = sampler.write_parquet(out)
        if written:
            print(f"power samples: {written}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description="Run a command with the NVML power sampler.")
    parser.add_argument("--out", required=True, help="Parquet file for the samples")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (… -- CMD ...)")
    sys.exit(run(command, args.out, args.interval))


if __name__ == "__main__":
    main()
