"""The machine the check runs on: NVML's view of torch's GPU, its power readings, versions."""

from __future__ import annotations

import os
import platform
import socket
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import polars as pl

from checks.gpu_check.model import Config
from checks.gpu_check.project import ADBC_STUBBED, NVTX_STUBBED

NVML_AVERAGING_NOTE = (
    "NVML documents nvmlDeviceGetPowerUsage as a 1 s average on Ampere (except GA100) and newer "
    "GPUs, instantaneous on older ones: a 1 s average puts the sampled power edge ~500 ms after "
    "the boundary"
)


def normalize_gpu_uuid(value: Any) -> str | None:
    """``GPU-<8-4-4-4-12 lowercase hex>`` from NVML's or torch's spelling, else None."""
    if value is None:
        return None
    raw = getattr(value, "bytes", None)  # torch's _CUuuid: a list of 16 ints
    text = str(value).strip().lower().removeprefix("gpu-")
    digits = text.replace("-", "")
    if len(digits) != 32 or any(ch not in "0123456789abcdef" for ch in digits):
        if isinstance(raw, bytes | bytearray | list | tuple) and len(raw) == 16:
            digits = bytes(raw).hex()
        else:
            return None
    return "GPU-" + str(uuidlib.UUID(hex=digits))


def _field_watts(value: Any, nv: Any) -> float | None:
    """A power field value (mW, any NVML value type) in W, or None when NVML refused it."""
    if getattr(value, "nvmlReturn", 1) != getattr(nv, "NVML_SUCCESS", 0):
        return None
    member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    kind = int(getattr(value, "valueType", 1))
    raw = getattr(value.value, member[kind] if 0 <= kind < len(member) else "uiVal")
    return float(raw) / 1000.0


class NvmlProbe:
    """An NVML handle of this process on torch's GPU: static facts and power-field readings."""

    def __init__(self, torch_uuid: str | None) -> None:
        import pynvml as nv

        nv.nvmlInit()
        self.nv = nv
        self.handle, self.index = self._handle_for(torch_uuid)
        self.readings: list[dict[str, Any]] = []
        self.counter_reads: list[dict[str, Any]] = []

    def _handle_for(self, torch_uuid: str | None) -> tuple[Any, int]:
        """The NVML handle whose UUID is torch's device 0 (index 0 when none matches)."""
        nv = self.nv
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            if self._uuid_of(handle) == torch_uuid:
                return handle, index
        return nv.nvmlDeviceGetHandleByIndex(0), 0

    def _uuid_of(self, handle: Any) -> str | None:
        """An NVML handle's GPU UUID, normalized; None when NVML does not say."""
        nv = self.nv
        return normalize_gpu_uuid(_decode(_try(lambda: nv.nvmlDeviceGetUUID(handle))))

    def facts(self) -> dict[str, Any]:
        """Driver, NVML, GPU name, UUID, power limit, and which power fields exist."""
        nv, h = self.nv, self.handle
        limit = _try(lambda: nv.nvmlDeviceGetPowerManagementLimit(h))
        return {
            "nvml_index": self.index,
            "driver": _decode(_try(nv.nvmlSystemGetDriverVersion)),
            "nvml_version": _decode(_try(nv.nvmlSystemGetNVMLVersion)),
            "gpu_name": _decode(_try(lambda: nv.nvmlDeviceGetName(h))),
            "nvml_uuid": _decode(_try(lambda: nv.nvmlDeviceGetUUID(h))),
            "power_limit_w": None if limit is None else limit / 1000.0,
            "has_field_power_instant": hasattr(nv, "NVML_FI_DEV_POWER_INSTANT"),
            "has_field_power_average": hasattr(nv, "NVML_FI_DEV_POWER_AVERAGE"),
        }

    def read(self, step_index: int, phase_name: str, t_into_s: float) -> None:
        """Record power usage and the instant/average power fields (None where unsupported)."""
        nv, h = self.nv, self.handle
        usage = _try(lambda: nv.nvmlDeviceGetPowerUsage(h))
        row: dict[str, Any] = {
            "step": step_index,
            "phase": phase_name,
            "t_into_phase_s": round(t_into_s, 3),
            "usage_w": None if usage is None else usage / 1000.0,
        }
        for key, name in (
            ("instant_w", "NVML_FI_DEV_POWER_INSTANT"),
            ("average_w", "NVML_FI_DEV_POWER_AVERAGE"),
        ):
            row[key] = self._field_w(name)
        self.readings.append(row)

    def _field_w(self, name: str) -> float | None:
        """The power field ``name`` (an ``NVML_FI_*`` constant) in W, None where unsupported."""
        nv, h = self.nv, self.handle
        fid = getattr(nv, name, None)
        values = None if fid is None else _try(lambda: nv.nvmlDeviceGetFieldValues(h, [fid]))
        return None if not values else _try(lambda: _field_watts(values[0], nv))

    def read_counter(self, step_index: int, phase_name: str, at: str) -> None:
        """One synchronous read of the total-energy counter, bracketed by ``time.monotonic_ns()``.

        The sampler's samples are stamped with the same clock, in the same process; the value
        was current at some instant in [``mono_ns_before``, ``mono_ns_after``].
        """
        nv, h = self.nv, self.handle
        before = time.monotonic_ns()
        energy = _try(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        after = time.monotonic_ns()
        self.counter_reads.append(
            {
                "step": step_index,
                "phase": phase_name,
                "at": at,
                "mono_ns_before": before,
                "mono_ns_after": after,
                "energy_mj": None if energy is None else int(energy),
            }
        )

    def close(self) -> None:
        """Release this handle's NVML reference."""
        _try(self.nv.nvmlShutdown)


def _try(read: Callable[[], Any]) -> Any:
    """An optional NVML reading: None on any error (unsupported field, old driver)."""
    try:
        return read()
    except Exception:
        return None


def _decode(value: Any) -> Any:
    """Bytes from older pynvml as str."""
    return value.decode("ascii", errors="replace") if isinstance(value, bytes) else value


def classify_power_reading(readings: list[dict[str, Any]]) -> str:
    """Whether ``nvmlDeviceGetPowerUsage`` tracks the instant or the averaged power field.

    Only readings where the two fields differ by more than 10% can tell; each votes for the
    field its usage value is closer to.
    """
    votes: Counter[str] = Counter()
    for r in readings:
        usage, inst, avg = r.get("usage_w"), r.get("instant_w"), r.get("average_w")
        if usage is None or inst is None or avg is None:
            continue
        if abs(inst - avg) <= 0.1 * max(abs(inst), abs(avg), 1.0):
            continue
        votes["averaged" if abs(usage - avg) < abs(usage - inst) else "instantaneous"] += 1
    if not votes:
        return "undetermined (fields unsupported, or instant ≈ average at every probe)"
    kind, n = votes.most_common(1)[0]
    return f"{kind} ({n} of {sum(votes.values())} telling probes)"


def nvml_available() -> tuple[bool, str]:
    """Whether NVML initializes here, and why not."""
    try:
        import pynvml
    except ImportError:
        return False, "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return False, f"NVML unavailable ({exc})"
    _try(pynvml.nvmlShutdown)
    return True, ""


def environment(torch: Any, cfg: Config) -> dict[str, Any]:
    """Versions and the device torch runs on."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "polars": pl.__version__,
        "adbc_stubbed": ADBC_STUBBED,
        "nvtx_stubbed": NVTX_STUBBED,
    }
    if not cfg.dry:
        props = torch.cuda.get_device_properties(0)
        env["torch_device"] = props.name
        env["torch_uuid"] = normalize_gpu_uuid(getattr(props, "uuid", None))
        env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return env
