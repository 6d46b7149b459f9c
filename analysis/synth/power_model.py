"""The synthetic power model: idle power plus a level per activity window, integrated exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .constants import BASE_UTC_NS, DRIVER_PID


class PowerKnobs(Protocol):
    """The power settings both run configurations carry."""

    @property
    def idle_power_w(self) -> float:
        """Power (W) of a GPU with nothing running."""

    @property
    def power_interval_ns(self) -> int:
        """Time between two samples of the sampler."""

    @property
    def power_mono_offset_ns(self) -> int:
        """The sampler's monotonic clock minus the run clock."""

    @property
    def power_wall_skew_ns(self) -> int:
        """The sampler host's wall clock minus the trace's."""

    @property
    def clock_mark_every_ns(self) -> int:
        """Time between two clock marks in the driver."""


@dataclass
class PowerModel:
    """What each GPU draws: idle, plus ``watts`` over each activity window ``[start, end)``."""

    knobs: PowerKnobs
    #: (gpu, start, end, extra watts), in the order they were laid out (sums follow it).
    activity: list[tuple[int, int, int, float]] = field(default_factory=list)

    def add(self, gpu: int, start: int, end: int, watts: float) -> None:
        """GPU ``gpu`` draws ``watts`` more than idle over [start, end)."""
        self.activity.append((gpu, start, end, watts))

    def power_at(self, gpu: int, t: np.ndarray) -> np.ndarray:
        """True power (W) of ``gpu`` at instants ``t``."""
        power = np.full(t.shape, self.knobs.idle_power_w)
        for g, start, end, watts in self.activity:
            if g == gpu:
                power += np.where((t >= start) & (t < end), watts, 0.0)
        return power

    def energy_j(self, gpu: int, start: int, end: int) -> float:
        """Exact integral of :meth:`power_at` over [start, end] (J)."""
        total = self.knobs.idle_power_w * (end - start)
        for g, s, e, watts in self.activity:
            if g == gpu:
                total += watts * max(0, min(end, e) - max(start, s))
        return total / 1e9

    def cumulative_energy_j(self, gpu: int, t: np.ndarray) -> np.ndarray:
        """Energy (J) from instant 0 to each of ``t`` (exact, vectorized over instants)."""
        total = self.knobs.idle_power_w * t.astype(np.float64)
        for g, s, e, watts in self.activity:
            if g == gpu:
                total += watts * np.clip(t - s, 0, e - s)
        return total / 1e9

    def sample_times(self, duration: int) -> np.ndarray:
        """Instants (run clock) the sampler read every GPU, over a run of ``duration`` ns."""
        return np.arange(0, duration + 1, self.knobs.power_interval_ns, dtype=np.int64)

    def clock_marks(self, duration: int) -> list[tuple[int, int, int]]:
        """(run ns, sampler mono ns, sampler wall ns) of each clock mark in the driver."""
        k = self.knobs
        times = [*range(0, duration, k.clock_mark_every_ns), duration]
        wall = BASE_UTC_NS + k.power_wall_skew_ns
        return [(t, t + k.power_mono_offset_ns, wall + t) for t in times]

    def append_samples(
        self,
        columns: dict[str, list],
        gpu: int,
        t: np.ndarray,
        *,
        host: str,
        uuid: str | None = None,
    ) -> None:
        """Append what NVML read of ``gpu`` at ``t`` to sampler-layout ``columns``.

        Power, an exact energy counter (mJ), and ``uuid`` where the layout has that column.
        """
        k = self.knobs
        power = self.power_at(gpu, t)
        counter_mj = np.round(self.cumulative_energy_j(gpu, t) * 1000.0).astype(np.int64)
        n = len(t)
        columns["host"] += [host] * n
        columns["pid"] += [DRIVER_PID] * n  # the sampler ran in the driver process
        columns["device"] += [gpu] * n
        if uuid is not None:
            columns["uuid"] += [uuid] * n
        columns["wall_ns"] += (BASE_UTC_NS + k.power_wall_skew_ns + t).tolist()
        columns["mono_ns"] += (t + k.power_mono_offset_ns).tolist()
        columns["power_w"] += power.tolist()
        columns["energy_mj"] += counter_mj.tolist()
        columns["sm_clock_mhz"] += [1980] * n
        columns["gpu_util_pct"] += np.where(power > k.idle_power_w, 100, 0).tolist()
        columns["mem_util_pct"] += [0] * n
