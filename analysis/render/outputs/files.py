"""Write an :class:`~analysis.model.Analysis` to a folder, each file atomically.

Every file is written to a temporary name in the same folder and renamed into place, so an
interrupted run never leaves a half-written table; files get the mode the user's umask gives
(``0o666 & ~umask``), like any file a program creates.

A command writes its folder through :func:`output_folder`, so that the folder ends up holding
exactly this run's outputs: what the tool wrote there before (listed in the manifest
:data:`MANIFEST`) and did not write again is removed after the new files are in place, e.g. the
power samples and power figures of an earlier run with power. Files the tool did not write (a
user's own notes in the folder) are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import polars as pl

from ...aggregate.activity_writer import ACTIVITY_FILE
from ...aggregate.kernels_by_phase import DEFAULT_TOP
from ...errors import OutputError, SavedAnalysisError
from ...model import Analysis
from .atomic import atomic_write
from .tables import TABLE_NAMES, TABLES

#: the list of files the tool wrote into an output folder (hidden; JSON)
MANIFEST = ".nvtx-phases-outputs.json"
#: every name the tool writes into ``--out`` (figures under ``figures/``, PNG and SVG): what is
#: cleaned from a folder an older version wrote, which has no manifest
_FIGURE_STEMS = (
    "phase_time_per_step",
    "busy_idle_per_phase",
    "phase_share",
    "data_movement_per_phase",
    "energy_per_phase_device",
    "power_timeline",
    "power_timeline_detail",
    "length_cdf",
    "length_heatmap",
    "straggler_timeline",
)
KNOWN_OUTPUTS = (
    *TABLE_NAMES,
    "report.html",
    "report.md",
    *(f"figures/{stem}.{ext}" for stem in _FIGURE_STEMS for ext in ("png", "svg", "csv")),
)


def check_output_folder(out: str | Path) -> None:
    """Fail early, in one line, when ``out`` cannot be, or become, a writable folder.

    Nothing is created here: a missing folder is created, with its missing parents (``mkdir
    -p``), only when the outputs are written (:func:`output_folder`), so a run that fails on its
    input leaves nothing behind. Raises :class:`~analysis.errors.OutputError`.
    """
    out = Path(out)
    if out.is_dir():
        try:
            fd, probe = tempfile.mkstemp(prefix=".nvtx-phases-probe.", dir=out)
        except OSError as exc:
            raise OutputError(
                f"--out {out}: cannot write in this folder ({exc.strerror or exc})"
            ) from exc
        os.close(fd)
        os.unlink(probe)
        return
    if out.exists() or out.is_symlink():
        raise OutputError(f"--out {out}: exists and is not a folder")
    existing = out.parent
    while not existing.is_dir() and not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"--out {out}: cannot create this folder ({existing} is not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out}: cannot create this folder ({existing} is not writable)")


def _relative_name(path: Path, out: Path) -> str | None:
    """``path`` as a POSIX name relative to ``out``; None when it lies outside ``out``."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(out))
    name = PurePosixPath(Path(rel).as_posix())
    return None if name.parts[:1] in (("..",), (".",)) else str(name)


def _safe_name(name: object) -> bool:
    """A manifest entry the cleanup may act on: a plain relative path inside the folder."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    parts = PurePosixPath(name).parts
    return not PurePosixPath(name).is_absolute() and all(p not in ("", ".", "..") for p in parts)


def previous_outputs(out: str | Path) -> set[str]:
    """What the tool wrote into ``out`` before, as relative POSIX names.

    Its manifest; else, in a folder written by a version without manifests (recognized by
    ``phases.parquet`` or ``report.html``), the known output names present.
    """
    out = Path(out)
    try:
        listed = json.loads((out / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        listed = None
    if isinstance(listed, list):
        return {name for name in listed if _safe_name(name)}
    if (out / "phases.parquet").is_file() or (out / "report.html").is_file():
        return {name for name in KNOWN_OUTPUTS if (out / name).is_file()}
    return set()


class OutputSession:
    """The files one command writes into its output folder (see :func:`output_folder`)."""

    def __init__(self, out: Path, keep: Iterable[str] = ()) -> None:
        self.out = out
        self.keep = {name for name in keep if _safe_name(name)}
        self.previous = previous_outputs(out)
        self.written: list[Path] = []
        self._names: set[str] = set()

    def add(self, paths: Iterable[Path]) -> list[Path]:
        """Record files written under the folder (figures drawn by workers too); returns them."""
        paths = list(paths)
        for path in paths:
            name = _relative_name(Path(path), self.out)
            if name is not None and name not in self._names:
                self._names.add(name)
                self.written.append(Path(path))
        return paths

    def write(self, name: str, write: Callable[[Path], object]) -> Path:
        """:func:`atomic_write` ``out/name`` and record it."""
        return self.add([atomic_write(self.out / name, write)])[0]

    def stale(self) -> list[str]:
        """Names the tool wrote before that this run neither wrote nor keeps."""
        return sorted(self.previous - self._names - self.keep)

    def finish(self) -> list[str]:
        """Remove the stale files (and folders they leave empty), write the manifest.

        Returns the names removed.
        """
        removed = []
        top = os.path.realpath(self.out)
        for name in self.stale():
            path = self.out / name
            parent = os.path.realpath(path.parent)
            if parent != top and not parent.startswith(top + os.sep):
                continue  # reached through a symlinked folder: not ours to clean
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)
                removed.append(name)
                _remove_empty_parents(path.parent, self.out)
        self._write_manifest(self._names | {n for n in self.keep if (self.out / n).exists()})
        return removed

    def abandon(self) -> None:
        """After a failure: list everything written so far or before, so a later run cleans it."""
        with suppress(OSError):
            self._write_manifest(self.previous | self._names | self.keep)

    def _write_manifest(self, names: set[str]) -> None:
        body = {"tool": "nvtx-phases", "files": sorted(names)}
        atomic_write(
            self.out / MANIFEST,
            lambda p: p.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8"),
        )


def _remove_empty_parents(folder: Path, out: Path) -> None:
    """``rmdir`` ``folder`` and its parents up to (not including) ``out`` while they are empty."""
    top = os.path.abspath(out)
    current = Path(os.path.abspath(folder))
    while str(current) != top and str(current).startswith(top + os.sep):
        try:
            current.rmdir()
        except OSError:  # not empty (a user's file, or a file this run wrote): keep it
            return
        current = current.parent


@contextmanager
def output_folder(out: str | Path, *, keep: Iterable[str] = ()) -> Iterator[OutputSession]:
    """Write one run's outputs into ``out``; afterwards it holds exactly this run's files.

    Creates ``out`` with its missing parents. Inside the block, record every file written
    (``session.add(paths)`` or ``session.write(name, writer)``); on success, what the tool
    wrote there before (its manifest :data:`MANIFEST`) and this run did not write is removed,
    except ``keep`` (names relative to ``out``: an analysis that ``report`` draws from the same
    folder), and the manifest is rewritten. Files the tool never wrote are left alone. On
    failure nothing is removed and the manifest lists the old and new files, so the next run
    into ``out`` cleans them.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"--out {out}: cannot create this folder ({exc.strerror or exc})"
        ) from exc
    session = OutputSession(out, keep)
    try:
        yield session
    except BaseException:
        session.abandon()
        raise
    session.finish()


def same_folder(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same existing folder."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_outputs(
    analysis: Analysis,
    out: str | Path,
    *,
    top_kernels: int | None = DEFAULT_TOP,
    on_frame: Callable[[str, Any], object] | None = None,
) -> list[Path]:
    """Write every table of the registry (:data:`analysis.render.outputs.tables.TABLES`) to ``out``.

    The tables the analysis supports: phases (Parquet+CSV), per-device phases, ranges, GPU
    activity, kernels, ``kernels_by_phase.csv`` (the ``top_kernels`` kernel names per phase;
    None or 0: all), steps, power samples and envelope, GPU metrics per phase, summary.
    ``on_frame(name, frame)``: called with each derived table written (e.g. to draw a figure
    from it without computing it again).
    A folder that cannot be made or written is an :class:`OutputError` (one line).
    """
    out = Path(out)
    check_output_folder(out)
    try:
        # the per-operation table is the big write (Polars releases the GIL): in a thread, while
        # the other tables are computed and written
        with ThreadPoolExecutor(max_workers=1) as pool:
            activity = pool.submit(
                atomic_write, out / "gpu_activity.parquet", _activity_writer(analysis)
            )
            written: list[Path] = []
            for table in TABLES:
                if table.name == "gpu_activity.parquet":
                    written.append(activity.result())
                    continue
                frame = table.frame(analysis, top_kernels)
                if frame is None or (table.skip_empty and frame.is_empty()):
                    continue
                if table.field is None and on_frame is not None:
                    on_frame(table.name, frame)
                written.append(atomic_write(out / table.name, partial(table.write, frame)))
    except OSError as exc:  # what check_output_folder cannot foresee (/proc, a full disk)
        raise OutputError(f"{out}: cannot write the outputs ({exc.strerror or exc})") from None
    return written


def _activity_writer(analysis: Analysis) -> Callable[[Path], object]:
    # a big run's activity is one Parquet file in its work folder: copied as it is when the
    # table is that whole file, else (a step selection) streamed, never collected; a small
    # one is in memory and written as it is
    whole = _whole_activity_file(analysis)
    if whole is not None:
        return lambda path: shutil.copyfile(whole, path)
    if analysis.workdir is not None:
        return lambda path: analysis.gpu_activity.sink_parquet(path)
    return lambda path: analysis.gpu_activity.collect().write_parquet(path)


def _whole_activity_file(analysis: Analysis) -> Path | None:
    """The bucketed run's activity file, when ``gpu_activity`` is exactly a scan of it."""
    if analysis.workdir is None:
        return None
    path = analysis.workdir / "activity" / ACTIVITY_FILE
    if not path.is_file():
        return None
    # a step selection filters the scan: its plan differs from the bare scan's
    bare = pl.scan_parquet(path).explain(optimized=False)
    return path if analysis.gpu_activity.explain(optimized=False) == bare else None


def load_analysis(folder: str | Path) -> Analysis:
    """Read back what :func:`write_outputs` wrote: the same shape :func:`analyze` returns.

    Every registry table that saves an :class:`Analysis` field is read back into it;
    ``gpu_activity`` is a lazy scan of ``gpu_activity.parquet`` (read only as far as a query
    needs); the result keeps no file open until it is queried.
    """
    folder = Path(folder)
    saved = [(t.name, t.field, t.read) for t in TABLES if t.field and t.read]
    missing = [t.name for t in TABLES if t.required and not (folder / t.name).exists()]
    if missing:
        raise SavedAnalysisError(
            f"{folder}: not an analysis folder (missing {', '.join(missing)}); "
            "run `nvtx-phases analyze` first"
        )
    fields: dict[str, Any] = {
        field: read(folder / name) for name, field, read in saved if (folder / name).exists()
    }
    # a folder whose activity file is gone has none (said by the commands that need it)
    fields.setdefault("gpu_activity", pl.LazyFrame())
    return Analysis(**fields)
