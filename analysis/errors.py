"""Named exceptions of the analysis side. The CLI turns each into a one-line message and exit 2."""

from __future__ import annotations


class AnalysisError(Exception):
    """Base class: anything the user can fix by giving other input."""


class TraceReadError(AnalysisError):
    """The file cannot be read as SQLite at all (missing, truncated, not a database)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: cannot read as an SQLite export ({reason})")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple:
        # picklable with its own arguments: errors cross process-pool and Ray boundaries
        return (type(self), (self.path, self.reason))


class NotAnNsysExport(AnalysisError):
    """A readable SQLite file that has none of the tables every nsys export carries."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: SQLite file but not an Nsight Systems export "
            "(no StringIds and no export metadata table); make one with "
            "`nsys export --type sqlite REPORT.nsys-rep`"
        )
        self.path = path

    def __reduce__(self) -> tuple:
        return (type(self), (self.path,))


class MissingColumns(AnalysisError):
    """A table exists but lacks columns this tool needs (an unknown nsys schema variant)."""

    def __init__(self, path: str, table: str, columns: list[str]) -> None:
        super().__init__(
            f"{path}: table {table} lacks column(s) {', '.join(columns)} "
            "(an nsys schema variant this version does not know; please report it)"
        )
        self.path = path
        self.table = table
        self.columns = columns

    def __reduce__(self) -> tuple:
        return (type(self), (self.path, self.table, self.columns))


class PhaseMapError(AnalysisError):
    """The user's phase-map TOML file is unreadable or malformed."""
