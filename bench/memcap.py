"""Run a command under a hard memory cap: a memory cgroup (v2 or v1) made for it.

The benchmark uses it to show that ``analyze`` handles an export that would not fit in the
cap if its operations were loaded whole. A cgroup cap is exact for resident memory, unlike
RLIMIT_AS, which counts the address space that allocators and thread stacks reserve but never
touch (Polars fails to import under a 2 GB RLIMIT_AS). Without a writable memory cgroup (not
root, or a container without one) :func:`memory_cap` yields None and the caller says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Cap:
    """A memory cgroup holding whatever ``enter`` moves into it (in a child before exec)."""

    folder: Path
    version: int

    @property
    def enter(self) -> Callable[[], None]:
        """A ``preexec_fn``: moves the new process (and so all it starts) into the cgroup."""
        procs = self.folder / "cgroup.procs"
        return lambda: procs.write_text(str(os.getpid()))

    def peak_mb(self) -> float | None:
        """Peak memory charged to the cgroup (resident memory and page cache), MB."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.folder / name).read_text()) / 2**20
        except (OSError, ValueError):
            return None

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process of the cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.folder / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key in ("oom_kill", "oom") and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """The memory cgroup folder of the running process and its version (/proc/self/cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _ROOT / "memory" / path.lstrip("/"), 1
    for line in lines:
        if line.startswith("0::"):
            folder = _ROOT / line[3:].lstrip("/")
            controllers = folder.parent / "cgroup.controllers"
            if controllers.exists() and "memory" in controllers.read_text().split():
                return folder.parent, 2
    return None


@contextlib.contextmanager
def memory_cap(limit_mb: int, name: str) -> Iterator[Cap | None]:
    """A fresh memory cgroup capped at ``limit_mb`` (no swap); None where none can be made."""
    found = _own_memory_cgroup()
    cap = None
    if found is not None:
        parent, version = found
        folder = parent / f"{name}-{os.getpid()}"
        limit = str(limit_mb * 2**20)
        try:
            folder.mkdir()
            if version == 2:
                (folder / "memory.max").write_text(limit)
                with contextlib.suppress(OSError):
                    (folder / "memory.swap.max").write_text("0")
            else:
                (folder / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):
                    (folder / "memory.memsw.limit_in_bytes").write_text(limit)
            cap = Cap(folder, version)
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
    try:
        yield cap
    finally:
        if cap is not None:
            with contextlib.suppress(OSError):
                cap.folder.rmdir()
