"""Sample GPU power, energy, SM clock and utilization with NVML in a background thread.

Per GPU and sample: ``host`` and ``pid`` of the sampling process, ``device`` (NVML's index on
that host), ``uuid`` (``nvmlDeviceGetUUID``: ``GPU-cf6b97c0-bf53-a39e-febd-9532190b5766``;
nsys's ``TARGET_INFO_GPU.uuid`` holds the same UUID without the ``GPU-`` prefix, so samples are
matched to the GPU a trace's operations ran on by UUID, not by index: under Ray every process
numbers its GPU 0), ``wall_ns`` and ``mono_ns`` (its clocks), ``power_w``,
``energy_mj`` (the GPU's total-energy counter where it has one, else null), ``sm_clock_mhz``,
``gpu_util_pct``, ``mem_util_pct``. Samples are written as Parquet next to the trace. Files from
samplers older than the ``uuid`` column lack it.

Clock alignment: at start, at stop and every ``mark_every_s`` seconds the sampler emits an NVTX
mark ``nvtx_phases.power_clock mono_ns=… wall_ns=…`` in the ``nvtx_phases`` domain. Run under
nsys, each mark lands on the trace's own timeline, so the analysis maps sampler time to trace
time from the trace itself (offset = mark time in the trace − ``mono_ns``), without trusting
two hosts' clocks to agree.

Without NVML (no driver, no GPU, or nvidia-ml-py not installed) the sampler says so once and
records nothing. NVML errors are mapped to that one message in :func:`_nvml`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nvtx

from nvtx_phases.naming import DOMAIN, SAMPLER_COLUMNS, clock_mark_text

log = logging.getLogger(__name__)
#: Columns of the sampler's Parquet (defined with the naming convention the analysis reads).
COLUMNS = SAMPLER_COLUMNS


def emit_clock_mark() -> tuple[int, int]:
    """Emit one clock mark now; returns the (mono_ns, wall_ns) it carries."""
    mono, wall = time.monotonic_ns(), time.time_ns()
    nvtx.mark(clock_mark_text(mono, wall), domain=DOMAIN)
    return mono, wall


def _nvml() -> Any | None:
    """The initialized ``pynvml`` module, or None with one logged reason."""
    try:
        import pynvml
    except ImportError:
        log.warning(
            "power: nvidia-ml-py is not installed (pip install nvtx-phases[power]); no power samples"
        )
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.warning("power: NVML unavailable (%s); no power samples", exc)
        return None
    return pynvml


def _optional(read: Callable[[], Any]) -> Any:
    """An NVML reading, or None where the GPU does not support it."""
    try:
        return read()
    except Exception:  # pynvml.NVMLError_NotSupported and friends: a missing field, not a failure
        return None


def gpu_uuid(nv: Any, handle: Any) -> str | None:
    """The GPU's UUID as NVML spells it (``GPU-…``; older pynvml returns bytes), or None."""
    uuid = _optional(lambda: nv.nvmlDeviceGetUUID(handle))
    if isinstance(uuid, bytes):
        uuid = uuid.decode("ascii", errors="replace")
    return uuid or None


@dataclass
class PowerSampler:
    """Background NVML sampler; use as a context manager or call ``start``/``stop``."""

    interval_s: float = 0.05
    mark_every_s: float = 10.0
    samples: dict[str, list] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    available: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _nvml_module: Any = None
    #: Host and pid of the sampling process: the analysis finds this process's clock marks by them.
    _host: str = field(default_factory=socket.gethostname)
    _pid: int = field(default_factory=os.getpid)

    def start(self) -> PowerSampler:
        """Start sampling (no-op with a single warning when NVML is unavailable)."""
        self._nvml_module = _nvml()
        self.available = self._nvml_module is not None
        emit_clock_mark()
        if self.available:
            self._thread = threading.Thread(target=self._run, name="nvtx-phases-power", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and emit the closing clock mark. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        emit_clock_mark()
        if self._nvml_module is not None:
            _optional(self._nvml_module.nvmlShutdown)
            self._nvml_module = None

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        nv = self._nvml_module
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        uuids = [gpu_uuid(nv, handle) for handle in handles]  # fixed for the process's life
        next_mark = time.monotonic() + self.mark_every_s
        try:
            while not self._stop.is_set():
                for index, handle in enumerate(handles):
                    self._sample(nv, index, handle, uuids[index])
                if time.monotonic() >= next_mark:
                    emit_clock_mark()
                    next_mark += self.mark_every_s
                self._stop.wait(self.interval_s)
        except Exception as exc:  # a sampler must never kill the workload it measures
            log.warning("power: sampling stopped (%s)", exc)

    def _sample(self, nv: Any, index: int, handle: Any, uuid: str | None) -> None:
        s = self.samples
        s["host"].append(self._host)
        s["pid"].append(self._pid)
        s["device"].append(index)
        s["uuid"].append(uuid)
        s["wall_ns"].append(time.time_ns())
        s["mono_ns"].append(time.monotonic_ns())
        milliwatts = _optional(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        s["power_w"].append(None if milliwatts is None else milliwatts / 1000.0)
        s["energy_mj"].append(_optional(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle)))
        s["sm_clock_mhz"].append(
            _optional(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        )
        util = _optional(lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        s["gpu_util_pct"].append(None if util is None else util.gpu)
        s["mem_util_pct"].append(None if util is None else util.memory)

    def write_parquet(self, path: str | Path) -> Path | None:
        """Write the samples (None and nothing written when there are none)."""
        if not self.samples["device"]:
            return None
        import polars as pl  # only where samples exist: workers that never sample stay light

        frame = pl.DataFrame(
            self.samples,
            schema={
                "host": pl.String,
                "pid": pl.Int64,
                "device": pl.Int32,
                "uuid": pl.String,
                "wall_ns": pl.Int64,
                "mono_ns": pl.Int64,
                "power_w": pl.Float64,
                "energy_mj": pl.Int64,
                "sm_clock_mhz": pl.Int32,
                "gpu_util_pct": pl.Int32,
                "mem_util_pct": pl.Int32,
            },
        )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(path)
        return path
