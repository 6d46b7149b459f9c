"""The summary of one analyzed run (``summary.json``): totals, traces, devices, warnings."""

from __future__ import annotations

from collections.abc import Sequence

from ..attribute.buckets import Attributed
from ..model import GpuDevice, RunSummary, TraceInfo
from .load import LoadedTrace


def run_summary(
    attributed: Attributed,
    loaded: Sequence[LoadedTrace],
    clock: tuple[dict[str, int], dict[str, int]],
    warnings: list[str],
    *,
    n_ranges: int,
    n_buckets: int,
    power_files: list[str],
) -> RunSummary:
    """The run's summary: attribution totals, traces on the run's clock, devices, warnings."""
    offsets, ends = clock  # each file's clock offset and capture end (None: unknown)
    return RunSummary(
        gpu=attributed.gpu,
        window_timeline=attributed.window_timeline,
        n_phase_ranges=attributed.n_phase_ranges,
        n_devices=attributed.n_devices,
        n_steps=attributed.steps.height,
        energy=attributed.energy,
        gpus=sorted({name for t in loaded for name in t.gpus}),
        driver_versions=sorted({t.driver_version for t in loaded if t.driver_version}),
        traces=[
            TraceInfo(
                label=t.label,
                path=str(t.path),
                nsys_version=t.nsys_version,
                host=t.host,
                session_start_utc_ns=t.session_start_utc_ns,
                clock_zero_utc_ns=t.clock_zero_utc_ns,
                clock_offset_ns=offsets[t.label],
                missing_tables=t.missing_tables,
                capture_end_ns=ends.get(t.label),
            )
            for t in loaded
        ],
        missing_tables=sorted({m for t in loaded for m in t.missing_tables}),
        devices=device_table(loaded),
        n_ranges=n_ranges,
        n_buckets=n_buckets,
        power_files=power_files,
        warnings=warnings,
        pools=attributed.pools.to_dicts() if attributed.pools is not None else None,
    )


def device_table(loaded: Sequence[LoadedTrace]) -> list[GpuDevice]:
    """The run's physical GPUs: name, how each is identified, and the files that used it."""
    rows: dict[str, GpuDevice] = {}
    for trace in loaded:
        described = {r["device"]: r for r in trace.gpu_identities.iter_rows(named=True)}
        for device in trace.ops.devices:
            info = described.get(device, {})
            row = rows.setdefault(
                device,
                GpuDevice(
                    device=device,
                    identity=info.get("identity") or "file",
                    gpu_name=info.get("gpu_name"),
                    uuid=info.get("uuid"),
                    bus_location=info.get("bus_location"),
                    host=trace.host,
                    traces=[],
                ),
            )
            row.traces.append(trace.label)
    return [rows[d] for d in sorted(rows)]
