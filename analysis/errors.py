"""Every named error of the analysis and the CLI; the CLI turns each into one line and exit 2.

The capture side's errors (:class:`~nvtx_phases.errors.NsysError`,
:class:`~nvtx_phases.errors.HookError`) are defined in ``nvtx_phases.errors`` so that training
workers never import the analysis; they are re-exported here.
"""

from __future__ import annotations

from nvtx_phases.errors import CaptureError, HookError, NsysError

__all__ = [
    "USER_ERRORS",
    "AnalysisError",
    "CaptureError",
    "CombineError",
    "HookError",
    "InputError",
    "MissingColumns",
    "MissingDependency",
    "NotAnNsysExport",
    "NothingToAnalyze",
    "NsysError",
    "OutputError",
    "PhaseMapError",
    "SavedAnalysisError",
    "TraceReadError",
    "UnsupportedExport",
    "WorkloadInputError",
]


class AnalysisError(Exception):
    """Base class: anything the user can fix by giving other input."""


class TraceReadError(AnalysisError):
    """The export cannot be read at all (missing, truncated, not a database or Parquet file).

    ``kind`` names the container: ``SQLite`` or ``parquetdir``.
    """

    def __init__(self, path: str, reason: str, kind: str = "SQLite") -> None:
        super().__init__(f"{path}: cannot read as an {kind} export ({reason})")
        self.path = path
        self.reason = reason
        self.kind = kind

    def __reduce__(self) -> tuple:
        # picklable with its own arguments: errors cross process-pool and Ray boundaries
        return (type(self), (self.path, self.reason, self.kind))


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


class UnsupportedExport(AnalysisError):
    """An nsys export whose layout this version does not know (please report it)."""


class MissingColumns(UnsupportedExport):
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


class InputError(AnalysisError):
    """An input path or option is wrong: a missing file, an empty folder, a bad power file."""


class OutputError(AnalysisError):
    """The output or work folder cannot be made or written."""


class CombineError(AnalysisError):
    """Files given as one run are not one run (capture windows apart, one process twice)."""


class NothingToAnalyze(AnalysisError):
    """The inputs hold no NVTX range and no GPU operation."""


class SavedAnalysisError(AnalysisError):
    """An analysis folder written earlier is damaged or from an incompatible version."""


class WorkloadInputError(AnalysisError):
    """Length records, fit parameters, VeRL logs or runs to compare are unusable as given."""


class MissingDependency(AnalysisError):
    """An optional package a feature needs is not installed (the message says which extra)."""


#: Everything the CLI reports as one line and exit 2: the analysis side's errors and the capture
#: side's (``nvtx_phases.errors``, stdlib only, so importing it here costs nothing).
USER_ERRORS: tuple[type[Exception], ...] = (AnalysisError, CaptureError)


def one_line(text: str) -> str:
    """``text`` with its lines joined by single spaces: every message is one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe_error(exc: BaseException) -> str:
    """The one-line message for an error the user can fix (an ``OSError`` names its path first)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        where = str(exc.filename)
        if exc.filename2 is not None:
            where += f" -> {exc.filename2}"
        return one_line(f"{where}: {exc.strerror or exc}")
    return one_line(str(exc)) or type(exc).__name__
