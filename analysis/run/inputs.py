"""Which SQLite exports a command analyzes: files and folders, ``.nsys-rep`` reports exported.

- a ``.sqlite`` file is taken as it is (the reader checks it);
- a ``.nsys-rep`` report is exported with ``nsys export --type sqlite`` to the ``.sqlite`` beside
  it, unless that file is already there and at least as new as the report (then it is reused);
  when the report's folder is not writable, the export goes to a cache folder instead
  (:func:`export_cache_dir`), and the caller is told so;
- a folder stands for the ``*.sqlite`` and ``*.nsys-rep`` files directly inside it, one per
  report: ``X.nsys-rep`` and ``X.sqlite`` together count once.

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

#: the extension of an Nsight Systems report
REPORT_SUFFIX = ".nsys-rep"
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
    """The SQLite exports that ``paths`` (files and folders, as given) stand for.

    ``.nsys-rep`` reports are exported (or their fresh export reused); a file given twice, or
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
        if path.is_dir():
            found = folder_inputs(path)
            if not found:
                raise InputError(
                    f"{path}: folder holds no *.sqlite export and no *{REPORT_SUFFIX} report"
                )
            for item in found:
                add(sqlite_for(item, notify=say, nsys=nsys, timeout_s=timeout_s))
        else:
            add(sqlite_for(path, notify=say, nsys=nsys, timeout_s=timeout_s))
    return resolved


def folder_inputs(folder: Path) -> list[Path]:
    """The exports and reports directly inside ``folder``, one per report, sorted by name.

    ``X.nsys-rep`` stands for itself and its ``X.sqlite``; hidden files (an export in progress
    is written under a hidden temporary name) are left out.
    """
    by_stem: dict[str, Path] = {}
    for path in folder.iterdir():
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.name.endswith(REPORT_SUFFIX):
            by_stem[path.name[: -len(REPORT_SUFFIX)]] = path  # the report wins over its export
        elif path.suffix == ".sqlite":
            by_stem.setdefault(path.name[: -len(".sqlite")], path)
    return [by_stem[stem] for stem in sorted(by_stem)]


def sqlite_for(
    path: Path,
    *,
    notify: Notify | None = None,
    nsys: str | None = None,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> Path:
    """``path`` itself, or for a ``.nsys-rep`` report its SQLite export (see the module doc)."""
    if not path.name.endswith(REPORT_SUFFIX):
        return path
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    beside = path.with_name(path.name[: -len(REPORT_SUFFIX)] + ".sqlite")
    if _fresh(beside, path):
        return beside
    if _writable(path.parent):
        target, cached = beside, False
    else:
        target, cached = export_cache_dir() / _cache_key(path) / beside.name, True
        if _fresh(target, path):
            if notify:
                notify(
                    f"{path.parent} is not writable: using {target}, exported earlier"
                    + _power_hint(path)
                )
            return target
    from nvtx_phases.nsys import NsysError, export_sqlite, locate_nsys  # stdlib only

    executable = locate_nsys(nsys)
    if executable is None:
        command = shlex.join(
            ["nsys", "export", "--type", "sqlite"]
            + (["--force-overwrite", "true"] if beside.exists() else [])
            + ["--output", str(beside), str(path)]
        )
        raise NsysError(
            f"{path}: a report needs an SQLite export and nsys is not on PATH (nor in $NSYS): "
            f"run `{command}` where nsys is installed, then analyze {beside.name}"
        )
    if cached:
        target.parent.mkdir(parents=True, exist_ok=True)
        if notify:
            notify(
                f"{path.parent} is not writable: exporting {path.name} to {target}"
                + _power_hint(path)
            )
    elif notify:
        notify(f"exporting {path} to {target} (nsys export)")
    log = target.with_name(f".{target.name}.export.log")
    exported = export_sqlite(executable, path, target=target, log=log, timeout_s=timeout_s)
    log.unlink(missing_ok=True)  # kept when the export failed: the error names it
    return exported


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
    stem = report.name[: -len(REPORT_SUFFIX)]
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
        return export.is_file() and export.stat().st_mtime_ns >= report.stat().st_mtime_ns
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
