"""``nvtx-phases analyze X.nsys-rep``: exported with the real nsys, the export reused while fresh.

The capture is made here by the real nsys (NVTX and OS runtime only: no GPU needed); without
nsys the tests that need it skip, or fail where NVTX_PHASES_REQUIRE_NSYS=1. The missing-nsys
message is checked everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from nvtxp_testkit import REPO

WORKLOAD = """
import time
import nvtx
for _ in range(2):
    with nvtx.annotate("step"):
        with nvtx.annotate("gen"):
            time.sleep(0.02)
        time.sleep(0.005)
"""
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.fixture(scope="module")
def capture(nsys, tmp_path_factory) -> Path:
    """A tiny real report, ``X.nsys-rep``, exported by nobody yet."""
    folder = tmp_path_factory.mktemp("capture")
    args = [
        nsys,
        "profile",
        "--trace=nvtx,osrt",
        "--sample=none",
        "--cpuctxsw=none",
        "--force-overwrite=true",
        "-o",
        str(folder / "X"),
        sys.executable,
        "-c",
        WORKLOAD,
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # nsys and its agent: the whole group
        proc.communicate()
        pytest.fail("nsys profile did not finish within 180 s")
    report = folder / "X.nsys-rep"
    assert proc.returncode == 0 and report.is_file(), output
    assert list(folder.glob("*.sqlite")) == []
    return report


def place(report: Path, folder: Path) -> Path:
    """A copy of ``report`` (same mtime) alone in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(report, folder / report.name))


def cli(*args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None):
    """``nvtx-phases ARGS`` in a subprocess; the completed process."""
    base = {k: v for k, v in os.environ.items() if k not in ("NVTX_PHASES_DEBUG", "NSYS")}
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "nvtx_phases.analysis.cli", *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def phase_counts(out: Path) -> dict[tuple[int, str, str], int]:
    """(step, path, attribution) → ranges, from ``out/phases.parquet``."""
    phases = pl.read_parquet(out / "phases.parquet")
    rows = phases.select("step", "path", "attribution", "n_ranges").rows()
    return {(step, path, attr): n for step, path, attr, n in rows}


EXPECTED = {
    (0, "step", "window"): 1,
    (0, "step/gen", "window"): 1,
    (1, "step", "window"): 1,
    (1, "step/gen", "window"): 1,
}


def trace_labels(out: Path) -> list[str]:
    return [t["label"] for t in json.loads((out / "summary.json").read_text())["traces"]]


def test_report_is_exported_beside_it_then_reused(capture, tmp_path):
    report = place(capture, tmp_path / "traces")
    export = report.with_name("X.sqlite")
    out = tmp_path / "out"
    first = cli("analyze", str(report), "--out", str(out), "-q")
    assert first.returncode == 0, first.stderr
    assert f"note: exporting {report} to {export} (nsys export)" in first.stderr
    assert phase_counts(out) == EXPECTED
    assert trace_labels(out) == ["X"]
    assert sorted(p.name for p in report.parent.iterdir()) == ["X.nsys-rep", "X.sqlite"]
    exported = export.stat()

    second = cli("analyze", str(report), "--out", str(out), "-q")
    assert second.returncode == 0, second.stderr
    assert "exporting" not in second.stderr
    assert export.stat().st_mtime_ns == exported.st_mtime_ns
    assert export.stat().st_ino == exported.st_ino
    assert phase_counts(out) == EXPECTED

    # a report newer than its export is exported again
    later = exported.st_mtime_ns + 5_000_000_000
    os.utime(report, ns=(later, later))
    third = cli("analyze", str(report), "--out", str(out), "-q")
    assert third.returncode == 0, third.stderr
    assert f"note: exporting {report} to {export} (nsys export)" in third.stderr
    assert export.stat().st_mtime_ns != exported.st_mtime_ns
    assert phase_counts(out) == EXPECTED


def test_report_and_its_export_count_once(capture, tmp_path):
    report = place(capture, tmp_path / "traces")
    out = tmp_path / "out"
    done = cli("analyze", str(report.parent), "--out", str(out), "-q")  # exports X.sqlite
    assert done.returncode == 0, done.stderr
    assert trace_labels(out) == ["X"]
    # the folder now holds both: still one report, however it is named; a hidden export in
    # progress (another run's temporary name) is not an input
    export = report.with_name("X.sqlite")
    shutil.copy2(export, report.with_name(".X.4242.0badcafe.tmp.sqlite"))
    mixed = cli("analyze", str(report.parent), str(report), str(export), "--out", str(out), "-q")
    assert mixed.returncode == 0, mixed.stderr
    assert trace_labels(out) == ["X"]
    assert phase_counts(out) == EXPECTED


@pytest.mark.parametrize("stale_export", [False, True])
def test_without_nsys_the_error_is_the_command_to_run(tmp_path, stale_export):
    """Runs without nsys too: the report is never opened when there is no nsys to export it."""
    report = tmp_path / "traces" / "X.nsys-rep"
    report.parent.mkdir()
    report.write_bytes(b"placeholder: never read")
    export = report.with_name("X.sqlite")
    if stale_export:  # an export older than its report is not used
        export.write_bytes(b"older")
        os.utime(export, ns=(1_000_000_000, 1_000_000_000))
    path = os.pathsep.join(  # PATH without any folder holding an nsys (/bin and /usr/bin)
        d for d in os.environ.get("PATH", "").split(os.pathsep) if not Path(d, "nsys").exists()
    )
    done = cli("analyze", str(report), "--out", str(tmp_path / "out"), "-q", env={"PATH": path})
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    force = "--force-overwrite true " if stale_export else ""
    assert lines[0] == (
        f"error: {report}: a report needs an SQLite export and nsys is not on PATH (nor in "
        f"$NSYS): run `nsys export --type sqlite {force}--output {export} {report}` where nsys "
        "is installed, then analyze X.sqlite"
    )
    assert export.exists() == stale_export
    assert not (tmp_path / "out").exists()


def test_unwritable_folder_exports_to_the_cache(capture, tmp_path):
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is needed to make a folder unwritable for root")
        if subprocess.run([*DROP_DAC, "true"], capture_output=True).returncode != 0:
            pytest.skip("cannot drop CAP_DAC_OVERRIDE here (setpriv --bounding-set refused)")
        prefix = DROP_DAC
    else:
        prefix = []
    report = place(capture, tmp_path / "locked")
    power = report.with_name("X.power.parquet")  # never read: only named in the note
    power.write_bytes(b"placeholder")
    report.parent.chmod(0o555)
    cache = tmp_path / "cache"
    env = {"NVTX_PHASES_CACHE_DIR": str(cache)}
    out = tmp_path / "out"
    first = cli("analyze", str(report), "--out", str(out), "-q", env=env, prefix=prefix)
    assert first.returncode == 0, first.stderr
    [export] = list(cache.glob("*/X.sqlite"))
    assert list(cache.rglob("*")) == [export.parent, export]  # no temporary file or log left
    assert first.stderr.splitlines()[0] == (
        f"note: {report.parent} is not writable: exporting X.nsys-rep to {export} "
        f"(power samples beside it need --power {power})"
    )
    assert sorted(p.name for p in report.parent.iterdir()) == ["X.nsys-rep", "X.power.parquet"]
    assert phase_counts(out) == EXPECTED
    exported = export.stat().st_mtime_ns

    second = cli("analyze", str(report), "--out", str(out), "-q", env=env, prefix=prefix)
    assert second.returncode == 0, second.stderr
    assert second.stderr.splitlines()[0] == (
        f"note: {report.parent} is not writable: using {export}, exported earlier "
        f"(power samples beside it need --power {power})"
    )
    assert export.stat().st_mtime_ns == exported


def test_report_nsys_cannot_read_is_one_line(nsys, tmp_path):
    report = tmp_path / "junk.nsys-rep"
    report.write_text("not a report")
    done = cli("analyze", str(report), "--out", str(tmp_path / "out"), "-q")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    log = tmp_path / ".junk.sqlite.export.log"
    assert lines == [
        f"note: exporting {report} to {tmp_path / 'junk.sqlite'} (nsys export)",
        f"error: nsys export failed for {report} (exit 1): Exportation error: Cannot read "
        f"from stream.; log: {log}",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [log.name, "junk.nsys-rep"]


def test_missing_report_and_empty_folder(tmp_path):
    missing = tmp_path / "gone.nsys-rep"
    done = cli("analyze", str(missing), "--out", str(tmp_path / "out"), "-q")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {missing}: no such file"]
    (tmp_path / "empty").mkdir()
    done = cli("analyze", str(tmp_path / "empty"), "--out", str(tmp_path / "out"), "-q")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: {tmp_path / 'empty'}: folder holds no *.sqlite export and no *.nsys-rep report"
    ]
