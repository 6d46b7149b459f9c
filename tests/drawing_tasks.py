"""Figure-task stand-ins for tests/test_drawing.py, importable by its worker processes."""

import os
import time
from pathlib import Path


def write_pid(out: Path, name: str, delay_s: float = 0.0) -> list[Path]:
    """Wait ``delay_s``, then write this process's id to ``out/name``."""
    time.sleep(delay_s)
    path = Path(out) / name
    path.write_text(str(os.getpid()))
    return [path]


def fail(message: str) -> list[Path]:
    """Raise ValueError(message)."""
    raise ValueError(message)
