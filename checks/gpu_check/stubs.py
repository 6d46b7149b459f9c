"""Stand-ins for packages a bare GPU machine may lack (``adbc_driver_sqlite``, ``nvtx``).

Each is installed in ``sys.modules`` only when the real package cannot be imported; the
project's modules that import it then load, and this check uses none of what is stubbed.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def stub_missing_adbc() -> bool:
    """Stand in for ``adbc_driver_sqlite`` when it is not installed; True if stubbed.

    ``analysis.power`` imports ``analysis.reader`` (the SQLite reader) at import time; this check
    reads no SQLite, so a machine with only torch, polars, pyarrow, rich, nvtx and nvidia-ml-py
    (``PYTHONPATH=.`` with the system Python) can still run it.
    """
    try:
        import adbc_driver_sqlite.dbapi  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        return False

    class Missing:
        """Whatever the reader imports by name; any use says why it cannot work."""

        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, attr: str) -> Any:
            raise RuntimeError(f"adbc_driver_sqlite is not installed (stub for {self._name})")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"adbc_driver_sqlite is not installed (stub for {self._name})")

    def missing(name: str) -> Any:
        if name.startswith("__"):  # keep the import machinery's probes honest
            raise AttributeError(name)
        return Missing(name)

    package = types.ModuleType("adbc_driver_sqlite")
    dbapi = types.ModuleType("adbc_driver_sqlite.dbapi")
    package.__getattr__ = missing  # type: ignore[method-assign]
    dbapi.__getattr__ = missing  # type: ignore[method-assign]
    package.dbapi = dbapi  # type: ignore[attr-defined]
    sys.modules["adbc_driver_sqlite"] = package
    sys.modules["adbc_driver_sqlite.dbapi"] = dbapi
    return True


def stub_missing_nvtx() -> bool:
    """No-op ``nvtx`` when it is not installed; True if stubbed.

    The marking helpers import it; this check reads its ranges from the JSONL recorder, not from
    a profiler, so NVTX calls that do nothing change none of its numbers.
    """
    try:
        import nvtx  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        return False

    def push_range(
        message: Any = None,
        color: Any = None,
        domain: Any = None,
        category: Any = None,
        payload: Any = None,
    ) -> None:
        """Do nothing (the signature keeps ``payload``: the marking helpers look for it)."""

    module = types.ModuleType("nvtx")
    module.push_range = push_range  # type: ignore[attr-defined]
    module.start_range = push_range  # type: ignore[attr-defined]
    module.pop_range = lambda domain=None: None  # type: ignore[attr-defined]
    module.end_range = lambda handle: None  # type: ignore[attr-defined]
    module.mark = lambda message=None, color=None, domain=None, **kw: None  # type: ignore[attr-defined]
    sys.modules["nvtx"] = module
    return True
