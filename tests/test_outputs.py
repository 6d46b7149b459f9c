"""``--out DIR`` holds exactly one run's files, with the user's umask; unwritable outputs fail early.

Every run is the real CLI in a subprocess (so the umask and the exit status are the real ones).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from nvtx_phases.analysis.render.outputs.files import MANIFEST, output_folder
from nvtxp_testkit import REPO, SAMPLES

GRPO = SAMPLES / "grpo_synthetic.sqlite"  # power in grpo_synthetic.power.parquet beside it
CPU = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"  # no power, no GPU

#: what `analyze` writes for the CPU capture (no GPU work, no power: two figures)
CPU_RUN_FILES = {
    "phases.parquet",
    "phases.csv",
    "phase_devices.parquet",
    "ranges.parquet",
    "gpu_activity.parquet",
    "kernels.csv",
    "kernels_by_phase.csv",
    "steps.csv",
    "summary.json",
    "figures/phase_share.png",
    "figures/phase_share.svg",
    "figures/phase_time_per_step.png",
    "figures/phase_time_per_step.svg",
    "figures/phase_share.csv",
    "figures/phase_time_per_step.csv",
}
POWER_FILES = {
    "power_samples.parquet",
    "figures/power_timeline.png",
    "figures/power_timeline.svg",
    "figures/power_timeline_detail.png",
    "figures/power_timeline_detail.svg",
    "figures/energy_per_phase_device.png",
    "figures/energy_per_phase_device.svg",
    "power_envelope.csv",
    "figures/power_envelope.png",
    "figures/power_envelope.svg",
    *(
        f"figures/{stem}.csv"
        for stem in (
            "power_timeline",
            "power_timeline_detail",
            "energy_per_phase_device",
            "power_envelope",
        )
    ),
}
DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def cli(*args: str, umask: int = 0o022, prefix: list[str] | None = None):
    """Run ``nvtx-phases ARGS`` in a subprocess with ``umask``; the completed process."""
    env = {k: v for k, v in os.environ.items() if k != "NVTX_PHASES_DEBUG"}
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "nvtx_phases.analysis.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(umask),
    )


def files_under(folder: Path) -> set[str]:
    """Every file below ``folder``, as POSIX paths relative to it."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def without_dac_override() -> list[str]:
    """A command prefix under which permission bits bind this process (root: no DAC override)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to make a folder unwritable for root")
    if subprocess.run([*DROP_DAC, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here (setpriv --bounding-set refused)")
    return DROP_DAC


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """OUT after analyzing the GRPO run (with power), then the CPU capture, into it."""
    out = tmp_path_factory.mktemp("rerun") / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    first = cli("analyze", str(GRPO), "--out", str(out), "-q")
    assert first.returncode == 0, first.stderr
    after_first = files_under(out)
    second = cli("analyze", str(CPU), "--out", str(out), "-q")
    assert second.returncode == 0, second.stderr
    return out, after_first


def test_first_run_wrote_power_outputs(rerun):
    _, after_first = rerun
    gpu_figures = {
        f"figures/{stem}.{ext}"
        for stem in ("busy_idle_per_phase", "data_movement_per_phase")
        for ext in ("png", "svg", "csv")
    }
    # the GRPO run has NCCL kernels: its NCCL tables (the CPU run, none: removed after it)
    nccl = {"nccl_overlap.csv", "nccl_collectives.csv", "nccl_collectives_by_phase.csv"}
    assert after_first == (
        CPU_RUN_FILES | POWER_FILES | gpu_figures | nccl | {MANIFEST, "notes.txt"}
    )


def test_rerun_leaves_exactly_the_second_runs_files(rerun):
    out, _ = rerun
    assert files_under(out) == CPU_RUN_FILES | {MANIFEST, "notes.txt"}
    assert (out / "notes.txt").read_text() == "mine\n"  # the user's file is kept as it was
    summary = json.loads((out / "summary.json").read_text())
    assert [t["label"] for t in summary["traces"]] == ["cpu_rl_step_nsys2022.4"]
    assert summary["power_files"] == []
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest == {"tool": "nvtx-phases", "files": sorted(CPU_RUN_FILES)}


def test_files_get_the_umask(rerun):
    out, _ = rerun
    modes = {
        name: stat.S_IMODE((out / name).stat().st_mode)
        for name in files_under(out)
        if name != "notes.txt"
    }
    assert modes == {name: 0o644 for name in CPU_RUN_FILES | {MANIFEST}}
    assert stat.S_IMODE((out / "figures").stat().st_mode) == 0o755


def test_report_into_the_analysis_folder_keeps_it_and_draws_no_old_power(rerun):
    out, _ = rerun
    done = cli("report", str(out), "--out", str(out))
    assert done.returncode == 0, done.stderr
    # the report's table as CSV beside it (a CPU run: no kernels, so no kernel table)
    report_files = {"report.html", "report.md", "tables/phase_summary.csv"}
    assert files_under(out) == CPU_RUN_FILES | {MANIFEST, "notes.txt"} | report_files
    assert "- **energy**: no power samples" in (out / "report.md").read_text().splitlines()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["files"] == sorted(CPU_RUN_FILES | report_files)
    assert stat.S_IMODE((out / "report.html").stat().st_mode) == 0o644


def test_missing_parents_are_created_with_the_umask(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    done = cli("analyze", str(CPU), "--out", str(out), "-q", "--no-figures", umask=0o027)
    assert done.returncode == 0, done.stderr
    written = CPU_RUN_FILES - {n for n in CPU_RUN_FILES if n.startswith("figures/")}
    assert files_under(out) == written | {MANIFEST}
    assert {n: stat.S_IMODE((out / n).stat().st_mode) for n in written | {MANIFEST}} == {
        n: 0o640 for n in written | {MANIFEST}
    }
    for folder in (tmp_path / "a", tmp_path / "a" / "b", out):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750


def test_folder_from_an_older_version_is_cleaned_of_known_outputs_only(rerun, tmp_path):
    """No manifest (written before manifests existed): known output names are replaced."""
    out = tmp_path / "old"
    shutil.copytree(rerun[0], out)
    (out / MANIFEST).unlink()
    # versions without manifests never wrote the report's tables/ CSVs (an earlier test's
    # `report` into this folder did): an old folder has none
    shutil.rmtree(out / "tables", ignore_errors=True)
    (out / "power_samples.parquet").write_bytes(b"old run")
    (out / "figures" / "power_timeline.png").write_bytes(b"old run")
    (out / "figures" / "mine.png").write_bytes(b"user")
    (out / "report.html").write_text("an earlier report")  # a known output of `report`
    done = cli("analyze", str(CPU), "--out", str(out), "-q")
    assert done.returncode == 0, done.stderr
    assert files_under(out) == CPU_RUN_FILES | {MANIFEST, "notes.txt", "figures/mine.png"}


def test_failed_run_leaves_the_folder_untouched(rerun, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(rerun[0], out)
    before = {name: (out / name).read_bytes() for name in files_under(out)}
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_text("not a database")
    done = cli("analyze", str(bogus), "--out", str(out), "-q")
    assert done.returncode == 2
    assert {name: (out / name).read_bytes() for name in files_under(out)} == before


def one_error_line(done: subprocess.CompletedProcess) -> str:
    """The run's only stderr line (an ``error:`` line), after checking exit status 2."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_out_under_a_regular_file(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    out = blocker / "sub" / "out"
    line = one_error_line(cli("analyze", str(CPU), "--out", str(out), "-q"))
    assert line == f"error: --out {out}: cannot create this folder ({blocker} is not a folder)"


def test_out_is_a_regular_file(tmp_path):
    out = tmp_path / "file.txt"
    out.write_text("x")
    line = one_error_line(cli("report", str(CPU), "--out", str(out)))
    assert line == f"error: --out {out}: exists and is not a folder"
    assert out.read_text() == "x"


def test_out_in_a_read_only_folder(tmp_path):
    prefix = without_dac_override()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    line = one_error_line(cli("analyze", str(CPU), "--out", str(locked), "-q", prefix=prefix))
    assert line == f"error: --out {locked}: cannot write in this folder (Permission denied)"
    line = one_error_line(
        cli("analyze", str(CPU), "--out", str(locked / "new"), "-q", prefix=prefix)
    )
    assert (
        line
        == f"error: --out {locked / 'new'}: cannot create this folder ({locked} is not writable)"
    )
    assert list(locked.iterdir()) == []


def write_text(text: str):
    """A writer for :meth:`OutputSession.write`."""
    return lambda path: path.write_text(text)


def test_manifest_never_reaches_outside_the_folder(tmp_path):
    out = tmp_path / "out"
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "victim.txt").write_text("keep")
    (tmp_path / "outside.txt").write_text("keep")
    out.mkdir()
    (out / "link").symlink_to(victims, target_is_directory=True)
    listed = ["../outside.txt", str(tmp_path / "outside.txt"), "link/victim.txt", "a/../../x"]
    (out / MANIFEST).write_text(json.dumps({"tool": "nvtx-phases", "files": listed}))
    with output_folder(out) as session:
        session.write("new.txt", write_text("new"))
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert (victims / "victim.txt").read_text() == "keep"
    assert json.loads((out / MANIFEST).read_text())["files"] == ["new.txt"]


def test_failure_inside_the_folder_keeps_old_files_and_lists_new_ones(tmp_path):
    out = tmp_path / "out"
    with output_folder(out) as session:
        session.write("old.txt", write_text("old"))
    with pytest.raises(RuntimeError), output_folder(out) as session:
        session.write("sub/half.txt", write_text("half"))
        raise RuntimeError("disk full")
    assert files_under(out) == {"old.txt", "sub/half.txt", MANIFEST}
    assert json.loads((out / MANIFEST).read_text())["files"] == ["old.txt", "sub/half.txt"]
    with output_folder(out) as session:
        session.write("next.txt", write_text("next"))
    assert files_under(out) == {"next.txt", MANIFEST}
    assert not (out / "sub").exists()  # emptied by the cleanup, so removed
