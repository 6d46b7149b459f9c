"""``.qdrep`` reports (nsys before 2021.2) are taken wherever ``.nsys-rep`` ones are.

The container is the same (the file starts with the same "NVIDIA Tegra Profiler Report" header;
nsys renamed the extension), and the installed nsys exports a ``.qdrep`` like an ``.nsys-rep``:
the real capture here is made by nsys and copied under the old extension.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from nvtx_phases.analysis.errors import NsysError
from nvtx_phases.analysis.run.inputs import folder_inputs, resolve_trace_inputs
from nvtxp_testkit import SPLIT_SAMPLE

WORKLOAD = "import time, nvtx\nwith nvtx.annotate('step'):\n    time.sleep(0.02)\n"


def test_without_nsys_the_same_one_line_error(tmp_path):
    report = tmp_path / "X.qdrep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report")
    with pytest.raises(NsysError) as info:
        resolve_trace_inputs([report], nsys=str(tmp_path / "no-nsys"))
    export = tmp_path / "X.sqlite"
    assert str(info.value) == (
        f"{report}: a report needs an SQLite export and nsys is not on PATH (nor in $NSYS): "
        f"run `nsys export --type sqlite --output {export} {report}` where nsys is installed, "
        "then analyze X.sqlite"
    )


def test_a_qdrep_counts_once_with_its_export(tmp_path):
    shutil.copy(SPLIT_SAMPLE[0], tmp_path / "A.sqlite")
    (tmp_path / "A.qdrep").write_bytes(b"")
    (tmp_path / "B.qdrep").write_bytes(b"")
    (tmp_path / "B.nsys-rep").write_bytes(b"")
    assert [p.name for p in folder_inputs(tmp_path)] == ["A.qdrep", "B.nsys-rep"]


def test_a_fresh_export_beside_a_qdrep_is_reused(tmp_path):
    report = tmp_path / "X.qdrep"
    report.write_bytes(b"")
    export = shutil.copy(SPLIT_SAMPLE[0], tmp_path / "X.sqlite")
    os.utime(report, (1, 1))
    assert resolve_trace_inputs([report], nsys=str(tmp_path / "no-nsys")) == [Path(export)]


def test_real_nsys_exports_a_qdrep(nsys, tmp_path):
    args = [nsys, "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none"]
    args += ["--force-overwrite=true", "-o", str(tmp_path / "X"), sys.executable, "-c", WORKLOAD]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
                            start_new_session=True)  # fmt: skip
    try:
        proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("nsys profile did not finish within 180 s")
    original = tmp_path / "X.nsys-rep"
    old = tmp_path / "old" / "X.qdrep"
    old.parent.mkdir()
    shutil.copy(original, old)
    assert old.read_bytes()[:28] == b"NVIDIA Tegra Profiler Report"
    notes: list[str] = []
    found = resolve_trace_inputs([old.parent], nsys=nsys, notify=notes.append)
    assert found == [old.with_name("X.sqlite")]
    assert notes == [f"exporting {old} to {found[0]} (nsys export)"]
    from nvtx_phases.analysis.read.export import read_export

    ranges = read_export(found[0]).frames["NVTX_EVENTS"]
    assert ranges.height > 0
    again: list[str] = []
    assert resolve_trace_inputs([old], nsys=nsys, notify=again.append) == found
    assert again == []  # the fresh export is reused
