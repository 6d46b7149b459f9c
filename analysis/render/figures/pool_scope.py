"""Which GPU pool the figures drawn now belong to (asynchronous runs draw each per pool)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: the GPU pool a figure draws (set by :func:`for_pool`): its name in the title and the file
FIGURE_POOL: ContextVar[str | None] = ContextVar("figure_pool", default=None)


@contextmanager
def for_pool(pool: str) -> Iterator[None]:
    """Figures saved inside are one GPU pool's: ``Pool P:`` titles, ``STEM__pool-P`` files."""
    token = FIGURE_POOL.set(pool)
    try:
        yield
    finally:
        FIGURE_POOL.reset(token)
