"""Which exports a command analyzes: files and folders, reports (``.nsys-rep``, ``.qdrep``) exported.

- a ``.sqlite`` file is taken as it is (the reader checks it), and so is a parquetdir folder
  (``nsys export --type parquetdir``: one ``TABLE.parquet`` per table, see
  :mod:`analysis.read.parquetdir`);
- a report, ``X.nsys-rep`` or ``X.qdrep`` (the name nsys gave reports before 2021.2; the same
  container, which current nsys exports alike), is exported to ``X.sqlite`` beside it, or to the
  folder ``X.parquetdir`` when the installed nsys can write parquetdir (2024.6+), unless such an
  export is already there and at least as new as the report (then it is reused);
  ``$NVTX_PHASES_EXPORT_TYPE`` (``sqlite`` or ``parquetdir``) chooses instead. When the report's
  folder is not writable, the export goes to a cache folder (:func:`export_cache_dir`), and the
  caller is told so;
- a PyTorch profiler (Kineto) trace, ``.json`` or ``.json.gz`` (``X.pt.trace.json.gz``), is read
  as it is (:mod:`analysis.read.kineto`);
- a folder stands for the exports, reports and Kineto traces directly inside it (the rank files of
  one run), one per report: ``X.nsys-rep`` with ``X.sqlite`` or ``X.parquetdir`` counts once; a
  JSON file there counts only when it holds ``traceEvents``.

Every export is bounded by a timeout. Without nsys, the error names the exact command to run.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import InputError, OutputError
from ..read.kineto import KINETO_SUFFIXES, holds_trace_events
from ..read.parquetdir import PARQUETDIR_SUFFIXES, export_stem, is_parquetdir

#: the extension of an Nsight Systems report
REPORT_SUFFIX = ".nsys-rep"
#: every report extension: ``.qdrep`` is what nsys called the same container before 2021.2
REPORT_SUFFIXES = (REPORT_SUFFIX, ".qdrep")
#: environment variable choosing the export type of reports (``sqlite`` or ``parquetdir``)
EXPORT_TYPE_ENV = "NVTX_PHASES_EXPORT_TYPE"
#: seconds an ``nsys export`` may take (a multi-GB report of a long run takes minutes)
EXPORT_TIMEOUT_S = 1800.0
#: environment variable naming the folder for exports of reports in unwritable folders
CACHE_ENV = "NVTX_PHASES_CACHE_DIR"

Notify = Callable[[str], None]


def resolve_trace_inputs(
    paths: Iterable[Path],
    *,
    notify: Notify | None = None,
    nsys: str | None = None,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> list[Path]:
    """The exports (SQLite files, parquetdir folders, Kineto traces) that ``paths`` stand for.

    Reports are exported (or their fresh export reused); a file given twice, or
    both directly and through its folder or its report, counts once. ``notify`` receives one
    line per export made. Raises :class:`~analysis.errors.AnalysisError` (a folder without
    exports or reports, a missing report) or :class:`~nvtx_phases.nsys.NsysError` (no nsys, a
    failed or timed-out export), each a one-line message.
    """
    say = notify or (lambda _message: None)
    resolved: list[Path] = []
    seen: set[str] = set()

    def add(path: Path) -> None:
        key = os.path.normcase(os.path.abspath(path))
        if key not in seen:
            seen.add(key)
            resolved.append(path)

    for path in map(Path, paths):
        if is_parquetdir(path):
            add(path)
        elif path.is_dir():
            found = folder_inputs(path)
            if not found:
                # the wording tests and users know; parquetdirs, .qdrep reports, Kineto traces count too
                raise InputError(
                    f"{path}: folder holds no *.sqlite export and no *{REPORT_SUFFIX} report"
                )
            for item in found:
                add(export_for(item, notify=say, nsys=nsys, timeout_s=timeout_s))
        else:
            add(export_for(path, notify=say, nsys=nsys, timeout_s=timeout_s))
    return resolved


def report_stem(path: Path) -> str | None:
    """The report name of ``path`` (``X`` of ``X.nsys-rep``, ``X.qdrep``); None: not a report."""
    for suffix in REPORT_SUFFIXES:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.name[: -len(suffix)]
    return None


def folder_inputs(folder: Path) -> list[Path]:
    """The exports and reports directly inside ``folder``, one per report, sorted by name.

    ``X.nsys-rep`` (or ``X.qdrep``) stands for itself and its ``X.sqlite`` or parquetdir
    ``X.parquetdir`` / ``X_pqtdir``; of two exports of one name without their report, the
    SQLite file is read. Hidden entries (an export in progress is written under a hidden
    temporary name) are left out.
    """
    rank: dict[str, tuple[int, Path]] = {}  # stem → (priority, path); lower wins
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        stem = report_stem(path)
        if stem is not None and path.is_file():
            # the report wins over its exports; .nsys-rep over a .qdrep of the same name
            found = (0 if path.name.endswith(REPORT_SUFFIX) else 1, path)
        elif path.suffix == ".sqlite" and path.is_file():
            stem, found = path.name[: -len(".sqlite")], (2, path)
        elif is_parquetdir(path):
            stem, found = export_stem(path), (3, path)
        elif path.name.endswith(KINETO_SUFFIXES) and holds_trace_events(path):
            stem, found = path.name, (4, path)  # its own name: never one of a report's exports
        else:
            continue
        if stem not in rank or found[0] < rank[stem][0]:
            rank[stem] = found
    return [rank[stem][1] for stem in sorted(rank)]


def export_for(
    path: Path,
    *,
    notify: Notify | None = None,
    nsys: str | None = None,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> Path:
    """``path`` itself, or for a report its export (see the module doc)."""
    stem = report_stem(path)
    if stem is None:
        return path
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    beside = _fresh_export(path.parent, stem, path)
    if beside is not None:
        return beside
    writable = _writable(path.parent)
    folder = path.parent if writable else export_cache_dir() / _cache_key(path)
    if not writable:
        cached = _fresh_export(folder, stem, path)
        if cached is not None:
            if notify:
                notify(
                    f"{path.parent} is not writable: using {cached}, exported earlier"
                    + _power_hint(path)
                )
            return cached
    from nvtx_phases.nsys import export_parquetdir, export_sqlite, locate_nsys  # stdlib only

    executable = locate_nsys(nsys)
    if executable is None:
        raise _no_nsys(path, stem)
    kind = _export_type(executable)
    target = folder / (f"{stem}.parquetdir" if kind == "parquetdir" else f"{stem}.sqlite")
    if not writable:
        target.parent.mkdir(parents=True, exist_ok=True)
        if notify:
            notify(
                f"{path.parent} is not writable: exporting {path.name} to {target}"
                + _power_hint(path)
            )
    elif notify:
        how = "nsys export" + (" --type parquetdir" if kind == "parquetdir" else "")
        notify(f"exporting {path} to {target} ({how})")
    log = target.with_name(f".{target.name}.export.log")
    if kind == "parquetdir":
        exported = export_parquetdir(executable, path, target=target, log=log, timeout_s=timeout_s)
    else:
        exported = export_sqlite(executable, path, target=target, log=log, timeout_s=timeout_s)
    log.unlink(missing_ok=True)  # kept when the export failed: the error names it
    return exported


#: the old name of :func:`export_for`, from when reports were only exported to SQLite
sqlite_for = export_for


def _no_nsys(report: Path, stem: str) -> Exception:
    """The one-line error for a report without nsys: the export command to run elsewhere."""
    from nvtx_phases.nsys import NsysError

    beside = report.with_name(f"{stem}.sqlite")
    command = shlex.join(
        ["nsys", "export", "--type", "sqlite"]
        + (["--force-overwrite", "true"] if beside.exists() else [])
        + ["--output", str(beside), str(report)]
    )
    return NsysError(
        f"{report}: a report needs an SQLite export and nsys is not on PATH (nor in $NSYS): "
        f"run `{command}` where nsys is installed, then analyze {beside.name}"
    )


def _export_type(nsys: str) -> str:
    """``parquetdir`` when this nsys writes it (or ``$NVTX_PHASES_EXPORT_TYPE`` says so)."""
    from nvtx_phases.nsys import export_types

    chosen = os.environ.get(EXPORT_TYPE_ENV, "").strip().lower()
    if chosen not in ("", "sqlite", "parquetdir"):
        raise InputError(f"${EXPORT_TYPE_ENV}={chosen}: expected sqlite or parquetdir")
    if chosen == "sqlite":
        return "sqlite"
    if "parquetdir" in export_types(nsys):
        return "parquetdir"
    if chosen == "parquetdir":
        raise InputError(
            f"${EXPORT_TYPE_ENV}=parquetdir: {nsys} cannot export parquetdir (nsys 2024.6+ can)"
        )
    return "sqlite"


def _fresh_export(folder: Path, stem: str, report: Path) -> Path | None:
    """An export of ``report`` in ``folder`` at least as new as it (SQLite first), or None."""
    candidates = [folder / f"{stem}.sqlite"]
    candidates += [folder / f"{stem}{suffix}" for suffix in PARQUETDIR_SUFFIXES]
    return next((c for c in candidates if _fresh(c, report)), None)


def export_cache_dir() -> Path:
    """Where reports in unwritable folders are exported.

    ``$NVTX_PHASES_CACHE_DIR``, else ``$XDG_CACHE_HOME/nvtx-phases/exports`` (default
    ``~/.cache``), else, when that cannot be created or written, a folder of this user in the
    system temp folder.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    candidate = base / "nvtx-phases" / "exports"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if _writable(candidate):
            return candidate
    except OSError:
        pass
    uid = os.getuid()
    private = Path(tempfile.gettempdir()) / f"nvtx-phases-{uid}"
    private.mkdir(mode=0o700, exist_ok=True)
    if private.is_symlink() or private.stat().st_uid != uid:  # another user's: not ours to use
        raise OutputError(f"{private}: exists and belongs to another user; set ${CACHE_ENV}")
    return private / "exports"


def _power_hint(report: Path) -> str:
    """A note for an export away from its report: power samples beside the report.

    Those are looked for beside the export, so they need ``--power`` then.
    """
    stem = report_stem(report) or report.stem
    beside = [report.with_name(f"{stem}.power.parquet"), *report.parent.glob("power_*.parquet")]
    found = sorted(str(p) for p in beside if p.is_file())
    return f" (power samples beside it need --power {' '.join(found)})" if found else ""


def _cache_key(report: Path) -> str:
    """One cache folder per report path (reports of one name in other folders do not clash)."""
    return hashlib.sha256(os.path.abspath(report).encode()).hexdigest()[:16]


def _fresh(export: Path, report: Path) -> bool:
    """Whether ``export`` exists and is at least as new as ``report`` (a later export of it).

    "At least as new", not "newer": file systems with coarse timestamps give an export made in
    the same second as its report the same time.
    """
    try:
        complete = export.is_file() or is_parquetdir(export)
        return complete and export.stat().st_mtime_ns >= report.stat().st_mtime_ns
    except OSError:
        return False


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder``.

    Tried, not read from the permission bits: those do not bind root, a read-only mount does.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".nvtx-phases-probe.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True
