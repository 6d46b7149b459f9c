"""The import step, here: what the device brought back, made into SQLite exports and Parquet.

Per mode: ``<mode>.tar.gz`` unpacked into ``<out>/<mode>/``; each ``.qdstrm`` turned into a
``.nsys-rep`` by this machine's ``QdstrmImporter`` (Debian's ``nsight-systems`` package, see
``../shared/nsys/device-capture.md``); every report exported with ``nsys export --type sqlite``
(:func:`nvtx_phases.nsys.export_sqlite`); the sampler's JSON samples written as the Parquet the
analysis reads (:meth:`nvtx_phases.power.PowerSampler.write_parquet`, one schema).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from checks.gpu_capture.model import POWER_PARQUET, SAMPLES_FILE
from nvtx_phases.errors import NsysError
from nvtx_phases.nsys import export_sqlite, locate_nsys
from nvtx_phases.power import PowerSampler

IMPORTER_NAME = "QdstrmImporter"
DEBIAN_IMPORTER = Path("/usr/lib/nsight-systems/host-linux-x64") / IMPORTER_NAME


@dataclass
class Imported:
    """One mode's files, ready for the analysis, and what went wrong on the way."""

    mode: str
    folder: Path
    exports: list[Path] = field(default_factory=list)
    power: Path | None = None
    errors: list[str] = field(default_factory=list)


def find_importer(nsys: str | None) -> Path | None:
    """``$QDSTRM_IMPORTER``, the importer beside nsys's install, or Debian's; None if none."""
    candidates = [Path(os.environ["QDSTRM_IMPORTER"])] if os.environ.get("QDSTRM_IMPORTER") else []
    if nsys:
        real = Path(os.path.realpath(shutil.which(nsys) or nsys))
        candidates += [p / "host-linux-x64" / IMPORTER_NAME for p in real.parents[:3]]
    candidates.append(DEBIAN_IMPORTER)
    return next((p for p in candidates if p.is_file()), None)


def unpack(archive: Path, out: Path) -> Path:
    """``<mode>.tar.gz`` → ``out/<mode>/`` (replaced); only plain files and folders."""
    mode = archive.name.removesuffix(".tar.gz")
    shutil.rmtree(out / mode, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if (m.isfile() or m.isdir())
                   and m.name.split("/")[0] == mode and ".." not in m.name.split("/")]  # fmt: skip
        tar.extractall(out, members=members)  # members checked above
    return out / mode


def qdstrm_to_report(stream: Path, importer: Path, timeout_s: float = 900) -> Path:
    """``QdstrmImporter -i X.qdstrm`` → ``X.nsys-rep`` beside it (its log: ``X.import.log``)."""
    report = stream.with_suffix(".nsys-rep")
    log = stream.with_suffix(".import.log")
    with log.open("wb") as sink:
        done = subprocess.run(
            [str(importer), "-f", "-i", str(stream), "-o", str(report)],
            stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
        )  # fmt: skip
    if done.returncode != 0 or not report.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise NsysError(f"{importer.name} failed on {stream.name} ({done.returncode}): {tail[0]}")
    return report


def import_mode(archive: Path, out: Path) -> Imported:
    """Unpack one mode, import its streams, export every report, write its power Parquet."""
    folder = unpack(archive, out)
    result = Imported(mode=folder.name, folder=folder)
    nsys = locate_nsys()
    importer = find_importer(nsys)
    for stream in sorted(folder.glob("*.qdstrm")):
        if importer is None:
            result.errors.append(f"{stream.name}: no {IMPORTER_NAME} here (install nsight-systems)")
            continue
        try:
            qdstrm_to_report(stream, importer)
        except (NsysError, subprocess.SubprocessError, OSError) as exc:
            result.errors.append(str(exc))
    for report in sorted(folder.glob("*.nsys-rep")):
        if nsys is None:
            result.errors.append(f"{report.name}: nsys not found here, cannot export")
            continue
        try:
            result.exports.append(export_sqlite(nsys, report, timeout_s=900))
        except NsysError as exc:
            result.errors.append(str(exc))
    samples = folder / SAMPLES_FILE
    if samples.is_file():
        result.power = PowerSampler(samples=json.loads(samples.read_text())).write_parquet(
            folder / POWER_PARQUET
        )
    return result
