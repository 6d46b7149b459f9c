"""A step's phases by path: the one rule for ``step/X`` rows and the driver's top-level phases.

A range's path is built on its own thread (:mod:`analysis.attribute.hierarchy`), so ``step/X``
(one separator, under a ``step`` range) is a phase directly inside a step marked by the same
process. The *driver's top-level phases* are those rows under the *window* scheme: the
phases VeRL's trainer marks in its driver (``step/gen``, ``step/reward``, …), which launches no
GPU work itself.

Lives at the package's top (like :mod:`analysis.intervals`) so the aggregate, render, workload
and jobs modules that select these rows all import the same rule.
"""

from __future__ import annotations

import polars as pl

from nvtx_phases.naming import PATH_SEP, STEP

from .model import WINDOW


def is_step_phase(path: str = "path") -> pl.Expr:
    """Whether a row's ``path`` is a phase directly inside a step: ``step/X``."""
    col = pl.col(path)
    return col.str.starts_with(STEP + PATH_SEP) & (
        col.str.count_matches(PATH_SEP, literal=True) == 1
    )


def is_driver_phase() -> pl.Expr:
    """Whether a phase-table row is one of the driver's top-level phases (window ``step/X``)."""
    return is_step_phase() & (pl.col("attribution") == WINDOW)


def driver_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """The driver's top-level phases (:func:`is_driver_phase`): step, name, start, end, by start."""
    return (
        phases.filter(is_driver_phase())
        .select("step", "canonical", "start_ns", "end_ns")
        .sort("start_ns")
    )
