"""Run a command under Nsight Systems with defaults suited to RL runs, then export to SQLite.

Flags adapt to the installed ``nsys``: traces and options are offered only when its own
``nsys profile --help`` lists them, and GPU-only options only when a GPU is present. Every nsys
call is bounded by a timeout; a run that hangs (Debian's 2022.4 agent can keep spinning after
the workload exits) is killed with its whole process group.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_phases.errors import NsysError

DEFAULT_TRACES = ("cuda", "nvtx", "osrt", "cublas")
INSTALL_HINT = (
    "install Nsight Systems (GPU machines: the NVIDIA CUDA toolkit or the nsight-systems "
    "package from NVIDIA's repository; Debian: enable the non-free component and "
    "`apt-get install nsight-systems`, see ../shared/nsys/install-debian-nsys.sh), or put "
    "`nsys` on PATH / set NSYS=/path/to/nsys"
)


@dataclass(frozen=True)
class Nsys:
    """An installed nsys: its path, version and the option text of ``nsys profile --help``."""

    path: str
    version: str
    profile_help: str = field(repr=False)

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """``2022.4.2.1`` → ``(2022, 4, 2, 1)``."""
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:4])

    def supports(self, option: str) -> bool:
        """Whether ``nsys profile`` lists ``option`` (e.g. ``--cuda-graph-trace``)."""
        return re.search(rf"(^|\s){re.escape(option)}[=\s]", self.profile_help, re.M) is not None

    def trace_values(self) -> set[str]:
        """APIs ``--trace`` accepts, from the help text."""
        # the option's own entry ("-t, --trace=" at the start of a line), not mentions elsewhere
        match = re.search(
            r"^\s*-t, --trace=\s*Possible values are (.*?)\.", self.profile_help, re.S | re.M
        )
        return set(re.findall(r"'([\w-]+)'", match.group(1))) if match else set(DEFAULT_TRACES)


def locate_nsys(explicit: str | None = None) -> str | None:
    """The nsys executable to use (``explicit``, ``$NSYS``, or ``nsys`` on PATH), None if none.

    Runs nothing (unlike :func:`find_nsys`).
    """
    candidate = explicit or os.environ.get("NSYS") or shutil.which("nsys")
    if not candidate or not (shutil.which(candidate) or Path(candidate).is_file()):
        return None
    return candidate


def find_nsys(explicit: str | None = None) -> Nsys:
    """The nsys to use: ``explicit``, ``$NSYS``, or ``nsys`` on PATH."""
    candidate = locate_nsys(explicit)
    if candidate is None:
        raise NsysError(f"nsys not found: {INSTALL_HINT}")
    try:
        version = subprocess.run(
            [candidate, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
        help_text = subprocess.run(
            [candidate, "profile", "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NsysError(f"{candidate} does not run ({exc}); {INSTALL_HINT}") from exc
    found = re.search(r"\d{4}\.\d+(\.\d+)*", version)
    return Nsys(
        path=candidate, version=found.group(0) if found else version, profile_help=help_text
    )


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible (device node or a working ``nvidia-smi -L``)."""
    if Path("/dev/nvidia0").exists():
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


@dataclass(frozen=True)
class ProfileOptions:
    """What to capture. Defaults: CUDA, NVTX, OS runtime and cuBLAS; no CPU sampling."""

    traces: tuple[str, ...] = DEFAULT_TRACES
    cpu_sampling: bool = False
    gpu_metrics: bool = True
    cuda_graph_trace: str = "node"
    #: ``--cuda-memory-usage=true``: CUDA allocations and frees (memory per phase)
    cuda_memory_usage: bool = True
    extra_args: tuple[str, ...] = ()


def profile_args(
    nsys: Nsys, options: ProfileOptions, output_base: Path, *, gpu: bool
) -> tuple[list[str], list[str]]:
    """The ``nsys profile`` arguments for this nsys and machine, and notes on what was adapted."""
    notes: list[str] = []
    known = nsys.trace_values()
    traces = [t for t in options.traces if t in known]
    dropped = [t for t in options.traces if t not in known]
    if dropped:
        notes.append(f"nsys {nsys.version} cannot trace {', '.join(dropped)}; left out")
    args = [nsys.path, "profile", f"--trace={','.join(traces) or 'none'}"]
    if "cuda" in traces and options.cuda_graph_trace and nsys.supports("--cuda-graph-trace"):
        args.append(f"--cuda-graph-trace={options.cuda_graph_trace}")
    if "cuda" in traces and options.cuda_memory_usage:
        if nsys.supports("--cuda-memory-usage"):
            args.append("--cuda-memory-usage=true")
        else:
            notes.append(f"nsys {nsys.version} has no --cuda-memory-usage: no memory per phase")
    if not options.cpu_sampling:
        # also what keeps Debian's 2022.4 agent from hanging after the workload exits
        args += ["--sample=none", "--cpuctxsw=none"]
    if options.gpu_metrics:
        if not gpu:
            notes.append("no GPU visible: GPU metrics not collected")
        elif nsys.supports("--gpu-metrics-devices"):
            args.append("--gpu-metrics-devices=all")
        elif nsys.supports("--gpu-metrics-device"):
            args.append("--gpu-metrics-device=all")
        else:
            notes.append(f"nsys {nsys.version} has no GPU-metrics option")
    args += ["--force-overwrite=true", "--export=none", "-o", f"{output_base}_%h_%p"]
    args += list(options.extra_args)
    return args, notes


def _run_bounded(args: Sequence[str], timeout_s: float | None, *, log: Path | None = None) -> int:
    """Run in its own process group; on timeout or Ctrl-C, stop the whole group, then return."""
    out = open(log, "ab") if log else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise NsysError(f"timed out after {timeout_s:.0f} s: {' '.join(args[:3])} …") from None
        except KeyboardInterrupt:
            # let nsys finish writing what it has: SIGINT first, then harder
            _stop_group(proc, first=signal.SIGINT)
            raise
    finally:
        if out:
            out.close()


def _stop_group(proc: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    for sig, wait_s in ((first, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def export_args(
    nsys: str, report: Path, target: Path, *, overwrite: bool = True, kind: str = "sqlite"
) -> list[str]:
    """``nsys export --type KIND [--force-overwrite true] --output TARGET REPORT``."""
    force = ["--force-overwrite", "true"] if overwrite else []
    return [nsys, "export", "--type", kind, *force, "--output", str(target), str(report)]


def export_types(nsys: str) -> set[str]:
    """The ``--type`` values ``nsys export`` lists in its help (empty when it does not run)."""
    try:
        text = subprocess.run(
            [nsys, "export", "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    match = re.search(r"--type=\s*Possible values are:?(.*?)\.\s", text, re.S)
    return set(re.findall(r"[a-z]+", match.group(1))) if match else set()


def _last_line(log: Path) -> str:
    """The last non-empty line of an nsys log (its progress bars redraw with carriage returns)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    return lines[-1] if lines else ""


def export_sqlite(
    nsys: Nsys | str,
    report: Path,
    *,
    target: Path | None = None,
    log: Path | None = None,
    timeout_s: float = 1800,
) -> Path:
    """``nsys export --type sqlite`` of one report; returns the .sqlite path.

    ``target`` defaults to the report's name with ``.sqlite``, beside it; ``log`` (nsys's
    output) to ``.export.log`` beside the report. nsys writes a temporary name in the target's
    folder that is renamed into place when it succeeded, so an interrupted or failed export
    never leaves a partial ``.sqlite`` that a later run could take for a finished one. A
    failure or a timeout (``timeout_s``) raises :class:`NsysError` with nsys's last line.
    """
    path = nsys.path if isinstance(nsys, Nsys) else nsys
    target = target or report.with_suffix(".sqlite")
    log = log or report.with_suffix(".export.log")
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp.sqlite")
    try:
        code = _run_bounded(export_args(path, report, tmp), timeout_s, log=log)
        if code != 0 or not tmp.is_file():
            last = _last_line(log)
            raise NsysError(
                f"nsys export failed for {report} (exit {code})"
                + (f": {last}" if last else "")
                + f"; log: {log}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def export_parquetdir(
    nsys: Nsys | str, report: Path, *, target: Path, log: Path, timeout_s: float = 1800
) -> Path:
    """``nsys export --type parquetdir`` (nsys 2024.6+) of one report into the folder ``target``.

    Written under a temporary name in ``target``'s folder (nsys names it as given, or with
    ``_pqtdir`` appended, depending on its release) and renamed into place when complete.
    """
    path = nsys.path if isinstance(nsys, Nsys) else nsys
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    written = (tmp, tmp.with_name(tmp.name + "_pqtdir"))
    try:
        code = _run_bounded(export_args(path, report, tmp, kind="parquetdir"), timeout_s, log=log)
        folder = next((p for p in written if p.is_dir()), None)
        if code != 0 or folder is None:
            last = _last_line(log)
            raise NsysError(
                f"nsys export failed for {report} (exit {code})"
                + (f": {last}" if last else "")
                + f"; log: {log}"
            )
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(folder, target)
    finally:
        for leftover in written:
            shutil.rmtree(leftover, ignore_errors=True)
    return target


@dataclass
class ProfileRun:
    """What a profile run produced."""

    reports: list[Path]
    exports: list[Path]
    exit_code: int
    notes: list[str]
    interrupted: bool = False


def profile(
    command: Sequence[str],
    out_dir: Path,
    *,
    options: ProfileOptions | None = None,
    nsys: Nsys | None = None,
    name: str = "report",
    timeout_s: float | None = None,
) -> ProfileRun:
    """Run ``command`` under nsys, then export every report it wrote to SQLite.

    The workload's own exit code is kept; a non-zero one (or Ctrl-C) still exports what nsys
    wrote, so a crashed run leaves a usable report.
    """
    nsys = nsys or find_nsys()
    options = options or ProfileOptions()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    args, notes = profile_args(nsys, options, out_dir / name, gpu=gpu_present())
    interrupted = False
    try:
        code = _run_bounded([*args, *command], timeout_s)
    except KeyboardInterrupt:
        code, interrupted = 130, True
        notes.append("interrupted: exporting what nsys wrote")
    # reports of this run only (names carry host and pid; older runs may share the folder)
    reports = sorted(
        p for p in out_dir.glob(f"{name}_*.nsys-rep") if p.stat().st_mtime >= started - 1
    )
    if not reports:
        raise NsysError(
            f"nsys wrote no report in {out_dir} (workload exit {code}); "
            f"only a .qdstrm? Debian's 2022.4 needs its importer linked, see {INSTALL_HINT}"
        )
    exports = [export_sqlite(nsys, report) for report in reports]
    return ProfileRun(
        reports=reports, exports=exports, exit_code=code, notes=notes, interrupted=interrupted
    )


def verl_overrides(save_path: str, steps: Sequence[int] = (1, 2, 3)) -> list[str]:
    """Hydra overrides that make VeRL 0.9.1's own Ray workers run under nsys like ``profile``.

    Written against ``verl/trainer/config/ppo_trainer.yaml`` of VeRL 0.9.1; the last line installs
    the nvtx_phases hooks in every Ray worker process.
    """
    step_list = ",".join(str(s) for s in steps)
    nsys_opts = "global_profiler.global_tool_config.nsys"
    return [
        "global_profiler.tool=nsys",
        f"global_profiler.steps=[{step_list}]",
        f"global_profiler.save_path={save_path}",
        "global_profiler.relocate_results=True",
        f"{nsys_opts}.discrete=False",
        f"{nsys_opts}.worker_nsight_options.trace=cuda,nvtx,osrt,cublas",
        f"{nsys_opts}.worker_nsight_options.cuda-graph-trace=node",
        f"{nsys_opts}.worker_nsight_options.cuda-memory-usage=true",
        f"{nsys_opts}.controller_nsight_options.trace=cuda,nvtx,osrt,cublas",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        "actor_rollout_ref.ref.profiler.enable=True",
        "actor_rollout_ref.ref.profiler.all_ranks=True",
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=nvtx_phases.verl.install",
    ]
