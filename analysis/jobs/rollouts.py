"""Multi-turn and DAPO tables of ``lengths analyze`` and the report, from the records found."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from ..workload.records import RecordFiles


@dataclass(frozen=True)
class RolloutTables:
    """The tables by file stem, what to warn of and what the records cannot say.

    ``notes`` name quantities the records cannot give (the report lists them with its warnings);
    ``remarks`` explain how to read a table (printed by the CLI only).
    """

    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remarks: list[str] = field(default_factory=list)

    @property
    def multiturn(self) -> pl.DataFrame | None:
        """``multiturn_steps``, where there are multi-turn records."""
        return self.tables.get("multiturn_steps")

    @property
    def dapo(self) -> pl.DataFrame | None:
        """``dapo_steps``, where there is a DAPO filter record."""
        return self.tables.get("dapo_steps")


def compute_rollout_tables(files: RecordFiles) -> RolloutTables:
    """The multi-turn and DAPO tables of ``files`` (none where there are no such records)."""
    from ..workload import dapo, multiturn

    done = RolloutTables()
    if files.multiturn:
        records = multiturn.read_multiturn(files.multiturn)
        done.tables.update(multiturn.multiturn_tables(records))
        done.notes.extend(multiturn.missing_fields_notes(records))
        done.notes.extend(multiturn.partial_step_notes(done.tables["multiturn_steps"]))
        done.remarks.append(multiturn.LATENCY_NOTE)
    if files.dapo:
        batches = dapo.read_dapo_filter(files.dapo)
        steps = dapo.dapo_steps(batches)
        done.tables["dapo_steps"] = steps
        done.warnings.extend(dapo.count_mismatches(batches))
        done.notes.extend(dapo.unfilled_notes(steps))
    return done


@dataclass(frozen=True)
class RolloutOutputs:
    """:class:`RolloutTables` and the CSV files written of them."""

    written: list[Path]
    warnings: list[str]
    notes: list[str]
    multiturn: pl.DataFrame | None
    dapo: pl.DataFrame | None


def rollout_tables(files: RecordFiles, out: Path) -> RolloutOutputs:
    """:func:`compute_rollout_tables`, each table written as ``out/NAME.csv``."""
    from ..render.outputs.atomic import atomic_write

    done = compute_rollout_tables(files)
    written = [atomic_write(out / f"{name}.csv", t.write_csv) for name, t in done.tables.items()]
    notes = done.remarks + done.notes
    return RolloutOutputs(written, done.warnings, notes, done.multiturn, done.dapo)
