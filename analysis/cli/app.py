"""``nvtx-phases``: one typer CLI; each command calls one library function.

Errors are turned into messages in one place, :func:`error_boundary`, around every command:

- what the user can fix (:class:`analysis.errors.AnalysisError` and its subclasses, the capture
  side's ``NsysError`` and ``HookError``, ``OSError`` on a path, JSON that does not parse, a bad
  option value) is one line ``error: …`` on stderr and exit status 2;
- anything else is a bug: one line ``internal error: …`` asking for a report, exit status 1
  (what Python's own uncaught exception gives, so scripts see the same status as before);
- ``NVTX_PHASES_DEBUG=1`` also prints the traceback, for either kind.

Nothing printed here goes through Rich markup: ``[fit]`` in a message, a help text or a file
name is shown as it is.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

if TYPE_CHECKING:
    from analysis.run.pipeline import Analysis

try:  # typer >= 0.24 ships its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import ClickException

#: set to 1 to print the traceback of any error along with its one line
DEBUG_ENV = "NVTX_PHASES_DEBUG"

# Piped or captured output (CI logs, `make demo | tee`) has no terminal width; 80 columns would
# squeeze the phase table unreadably, so default to a wide console there (COLUMNS still wins).
# No markup: paths, range names and messages may hold brackets ("nvtx-phases[fit]").
console = Console(
    width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 150, markup=False
)
err_console = Console(stderr=True, markup=False)


def _one_line(text: str) -> str:
    """``text`` on one line: its lines joined with single spaces."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _print_error(label: str, message: str) -> None:
    err_console.print(
        Text.assemble((label, "bold red"), " ", _one_line(message)),
        highlight=False,
        soft_wrap=True,
    )


def _fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; return the ``typer.Exit(code)`` to raise."""
    _print_error("error:", message)
    return typer.Exit(code)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Exception classes that mean "the input or the environment is wrong", not a bug."""
    from analysis.errors import USER_ERRORS

    return (*USER_ERRORS, OSError, json.JSONDecodeError)


def describe_error(exc: BaseException) -> str:
    """The one-line message for an expected error (an ``OSError`` names its path first)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        where = str(exc.filename)
        if exc.filename2 is not None:
            where += f" -> {exc.filename2}"
        return _one_line(f"{where}: {exc.strerror or exc}")
    if isinstance(exc, json.JSONDecodeError):
        return _one_line(f"not valid JSON ({exc})")
    return _one_line(str(exc)) or type(exc).__name__


def _debug_traceback() -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exc(file=sys.stderr)


@contextmanager
def error_boundary() -> Iterator[None]:
    """Run a command; turn what it raises into one line on stderr and an exit status.

    Expected errors (see the module docstring) exit 2, usage errors with click's status (2),
    Ctrl-C 130, anything else 1 with a request to report it. Typer's own exits, aborts, the
    "no arguments: show help" signal and a closed stdout pipe pass through untouched.
    """
    try:
        yield
    except (typer.Exit, typer.Abort, BrokenPipeError):
        raise
    except ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2 prints the help for it
            raise
        _debug_traceback()
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _print_error("error:", exc.format_message() + hint)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _print_error("error:", "interrupted")
        raise typer.Exit(130) from None
    except _expected_errors() as exc:
        _debug_traceback()
        _print_error("error:", describe_error(exc))
        raise typer.Exit(2) from None
    except Exception as exc:
        _debug_traceback()
        _print_error(
            "internal error:",
            f"{type(exc).__name__}: {_one_line(str(exc))} (a bug in nvtx-phases: please report "
            f"it with the command line; {DEBUG_ENV}=1 prints the traceback)",
        )
        raise typer.Exit(1) from None


class ErrorBoundaryGroup(TyperGroup):
    """The root command group: every subcommand (and its option parsing) runs in the boundary."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Parse the root options (``nvtx-phases --bogus``) inside :func:`error_boundary`."""
        with error_boundary():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        """Invoke the subcommand inside :func:`error_boundary`."""
        with error_boundary():
            return super().invoke(ctx)


app = typer.Typer(
    name="nvtx-phases",
    help="Where the time, data movement and energy of an RL training step go, phase by phase.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # "\b": click keeps these lines as they are (its wrapping would split "nvtx-phases[fit]")
    epilog="\b\nOptional extras (pip install 'nvtx-phases[EXTRA]'):\n"
    "  nvtx-phases[fit]    length fits (scipy, scikit-learn)\n"
    "  nvtx-phases[power]  NVML power sampling (profile --power)\n"
    "  nvtx-phases[ray]    analyze --engine ray\n"
    "  nvtx-phases[verl]   the VeRL hooks\n"
    "\b\nErrors are one line on stderr with exit status 2; a bug says so with status 1\n"
    f"({DEBUG_ENV}=1 prints the traceback).",
    cls=ErrorBoundaryGroup,
    # plain click help: Rich markup would eat "[fit]" in "nvtx-phases[fit]"
    rich_markup_mode=None,
)


def expand_trace_paths(paths: list[Path]) -> list[Path]:
    """The SQLite exports that files and folders stand for (see :mod:`analysis.run.inputs`).

    Files as given; ``.nsys-rep`` reports exported (the ``.sqlite`` beside a report reused when
    it is newer); a folder for the exports and reports directly inside it.
    """
    from analysis.run.inputs import resolve_trace_inputs

    return resolve_trace_inputs(
        paths, notify=lambda note: err_console.print(Text(f"note: {note}"), soft_wrap=True)
    )


def _analyze_and_report(
    files: list[Path],
    out: Path,
    *,
    phase_map_path: Path | None = None,
    all_ranges: bool = False,
    power_files: list[Path] | None = None,
    idle_power_w: float | None = None,
    figures: bool = True,
    max_rows: int = 60,
    quiet: bool = False,
    jobs: int = 1,
    engine: str = "process",
    chunk_ops: int | None = None,
    spill_dir: Path | None = None,
    force_combine: bool = False,
) -> None:
    """Analyze, write outputs (and figures), print the table."""
    from analysis.attribute.phase_map import default_phase_map, load_phase_map
    from analysis.render.files import check_output_folder, output_folder, write_outputs
    from analysis.render.terminal import print_report
    from analysis.run.pipeline import analyze as run_analysis

    check_output_folder(out)  # before a long analysis, not after it
    pmap = load_phase_map(phase_map_path) if phase_map_path else default_phase_map()
    if all_ranges:
        pmap = pmap.with_all_ranges()
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        reading = bar.add_task("reading exports", total=len(files))
        result = run_analysis(
            files,
            phase_map=pmap,
            power_files=power_files,
            idle_power_w=idle_power_w,
            progress=lambda text: bar.update(reading, description=text),
            jobs=jobs,
            engine=engine,  # type: ignore[arg-type]
            on_file_done=lambda label: bar.update(reading, advance=1, description=f"read {label}"),
            **({"chunk_ops": chunk_ops} if chunk_ops else {}),
            spill_dir=spill_dir,
            force_combine=force_combine,
        )
        bar.update(reading, description="writing outputs")
        with output_folder(out) as session:  # afterwards out holds this run's files only
            written = session.add(write_outputs(result, out))
            if figures:
                from analysis.render.figures import write_figures  # matplotlib only when drawing

                bar.update(reading, description="drawing figures")
                written += session.add(write_figures(result, out / "figures"))
    if not quiet:
        print_report(result, console, max_rows=max_rows)
    else:  # quiet drops the table, never the warnings
        from rich.text import Text

        for warning in result.warnings:
            console.print(Text("warning: " + warning, style="yellow"))
    console.print(f"wrote {len(written)} files to {out}/")


@app.command()
def analyze(
    traces: Annotated[
        list[Path],
        typer.Argument(help="nsys SQLite exports of one run (files, or folders of *.sqlite)."),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for tables and figures.")] = Path(
        "out"
    ),
    phase_map: Annotated[
        Path | None,
        typer.Option("--phase-map", help="TOML file that extends or renames the phase names."),
    ] = None,
    all_ranges: Annotated[
        bool, typer.Option("--all-ranges", help="Treat every NVTX range as a phase.")
    ] = False,
    power: Annotated[
        list[Path] | None,
        typer.Option(
            "--power",
            help="NVML power samples (Parquet); default: <trace>.power.parquet and "
            "power_*.parquet beside the traces.",
        ),
    ] = None,
    no_power: Annotated[bool, typer.Option("--no-power", help="Ignore power samples.")] = False,
    idle_power_w: Annotated[
        float | None,
        typer.Option(help="Idle power per GPU (W) for energy above idle; default: measured."),
    ] = None,
    figures: Annotated[bool, typer.Option(help="Write figures under OUT/figures.")] = True,
    max_rows: Annotated[
        int, typer.Option(help="Rows of the printed table (all go to files).")
    ] = 60,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print no table.")] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=1, help="Read this many exports in parallel.")
    ] = 1,
    engine: Annotated[
        str,
        typer.Option(
            help="Where parallel reads run: 'process' (a local pool) or 'ray' (Ray tasks; an "
            "existing cluster via RAY_ADDRESS). Results are the same."
        ),
    ] = "process",
    chunk_ops: Annotated[
        int | None,
        typer.Option(
            min=1000,
            help="Most GPU operations held in memory at once (default 2,000,000: peak about 1.7 GB). "
            "Bigger runs spill to Parquet and are attributed in time buckets; same result.",
        ),
    ] = None,
    spill_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for spilled operations (default: the system temp folder; with "
            "--engine ray on a cluster, a shared file system)."
        ),
    ] = None,
    force_combine: Annotated[
        bool,
        typer.Option(
            "--force-combine",
            help="Analyze files together even when they look like different runs (capture "
            "windows apart, or the same process in two files).",
        ),
    ] = False,
) -> None:
    """Attribute GPU kernels, NCCL, memcpy, memset and energy to NVTX phases, per step and rank.

    Writes OUT/phases.parquet|csv, phase_devices.parquet, gpu_activity.parquet, kernels.csv,
    steps.csv and summary.json, then prints the per-step phase table. With power samples, the
    phases also get energy_j, avg/peak power and energy above idle.
    """
    if engine not in ("process", "ray"):
        raise _fail(f"--engine must be 'process' or 'ray', not '{engine}'")
    from analysis.render.files import check_output_folder

    check_output_folder(out)  # before exporting .nsys-rep reports and analyzing
    _analyze_and_report(
        expand_trace_paths(traces),
        out,
        phase_map_path=phase_map,
        all_ranges=all_ranges,
        power_files=[] if no_power else power,
        idle_power_w=idle_power_w,
        figures=figures,
        max_rows=max_rows,
        quiet=quiet,
        jobs=jobs,
        engine=engine,
        chunk_ops=chunk_ops,
        spill_dir=spill_dir,
        force_combine=force_combine,
    )


@app.command()
def report(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="An analysis folder (from `analyze`), or the traces of one run."),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the report.")] = Path(
        "report"
    ),
    idle_power_w: Annotated[
        float | None, typer.Option(help="Idle power per GPU (W); default: measured.")
    ] = None,
    lengths: Annotated[
        Path | None,
        typer.Option(
            help="Response-length records (PolyTrace layout); default: <trace>_lengths/ or "
            "lengths/ beside the inputs."
        ),
    ] = None,
    cap: Annotated[int | None, typer.Option(help="Max response length (fraction at cap).")] = None,
    force_combine: Annotated[
        bool,
        typer.Option(
            "--force-combine",
            help="Analyze files together even when they look like different runs (capture "
            "windows apart, or the same process in two files).",
        ),
    ] = False,
) -> None:
    """Write report.html (self-contained) and report.md: metadata, phase table, figures, warnings.

    With response-length records, also length statistics per step and rollout stragglers.
    """
    from analysis.render.figures import write_figures
    from analysis.render.files import (
        TABLE_NAMES,
        check_output_folder,
        output_folder,
        same_folder,
        write_outputs,
    )
    from analysis.render.report import write_report
    from analysis.run.pipeline import analyze as run_analysis

    check_output_folder(out)  # before a long analysis, not after it
    from_folder = len(inputs) == 1 and (inputs[0] / "phases.parquet").exists()
    if from_folder:
        result = load_analysis_folder(inputs[0])
    else:
        with console.status("analyzing…") as status:
            result = run_analysis(
                expand_trace_paths(inputs),
                idle_power_w=idle_power_w,
                progress=status.update,
                force_combine=force_combine,
            )
    # out ends up holding this run's files only; an analysis drawn from out itself stays
    keep = TABLE_NAMES if from_folder and same_folder(inputs[0], out) else ()
    with output_folder(out, keep=keep) as session:
        if not from_folder:
            session.add(write_outputs(result, out))
        figures = session.add(write_figures(result, out / "figures"))
        sections = []
        length_dir = lengths or _find_lengths(inputs)
        if length_dir is not None:
            from analysis.render.length_figures import (
                length_cdf,
                length_heatmap,
                straggler_timeline,
            )
            from analysis.workload.lengths import length_stats, read_packed_lengths
            from analysis.workload.stragglers import energy_per_token, generation_tails

            responses = read_packed_lengths([length_dir])
            stats = length_stats(responses, cap=cap)
            tails = generation_tails(result, stats)
            sections = [
                ("Response lengths per step", stats),
                ("Rollout stragglers", tails),
                ("Energy per generated token", energy_per_token(result, stats)),
            ]
            figures += session.add(
                length_cdf(responses, out / "figures") + length_heatmap(responses, out / "figures")
            )
            figures += session.add(straggler_timeline(tails, out / "figures"))
        written = session.add(write_report(result, out, figures, sections))
    for path in written:
        console.print(f"wrote {path}")


#: most lines of compare.md printed (the file has them all)
COMPARE_PRINTED_LINES = 200


@app.command()
def compare(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Runs: analysis folders, trace files, or folders of one run's traces."),
    ],
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="One label per run (default: names).")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the comparison.")] = Path(
        "compare"
    ),
    phase_map: Annotated[
        Path | None,
        typer.Option(
            "--phase-map", help="TOML file that extends or renames the phase names (traces only)."
        ),
    ] = None,
    all_ranges: Annotated[
        bool,
        typer.Option("--all-ranges", help="Treat every NVTX range as a phase (traces only)."),
    ] = False,
) -> None:
    """Compare runs per phase: time, energy, power, data movement (median, p10–p90, differences).

    Runs without step ranges are compared over the whole capture. Runs with no phase in common
    are refused.
    """
    from analysis.attribute.phase_map import default_phase_map, load_phase_map
    from analysis.run.pipeline import analyze as run_analysis
    from analysis.workload.compare import write_comparison

    if len(runs) < 2:
        raise _fail("compare needs at least two runs")
    labels = list(label or [])
    if labels and len(labels) != len(runs):
        raise _fail(f"{len(labels)} label(s) for {len(runs)} runs")
    labels = labels or [r.stem if r.is_file() else r.name for r in runs]
    if len(set(labels)) != len(labels):
        raise _fail(f"run labels must differ: {', '.join(labels)} (use --label)")
    pmap = load_phase_map(phase_map) if phase_map else default_phase_map()
    if all_ranges:
        pmap = pmap.with_all_ranges()
    analyses = {}
    for name, run in zip(labels, runs, strict=True):
        if _is_analysis_folder(run):
            if phase_map or all_ranges:
                err_console.print(
                    Text(f"note: {run} was analyzed already; --phase-map/--all-ranges not applied"),
                    soft_wrap=True,
                )
            analyses[name] = load_analysis_folder(run)
        else:
            with console.status(Text(f"analyzing {name}…")):
                analyses[name] = run_analysis(expand_trace_paths([run]), phase_map=pmap)
    written = write_comparison(analyses, out)
    lines = (out / "compare.md").read_text(encoding="utf-8").splitlines()
    shown = lines[:COMPARE_PRINTED_LINES]  # thousands of phases (--all-ranges) stay in the file
    if len(lines) > len(shown):
        shown.append(f"… {len(lines) - len(shown):,} more lines in {out / 'compare.md'}")
    console.print("\n".join(shown), highlight=False, soft_wrap=True)
    console.print(f"wrote {len(written)} files to {out}/")


def _find_lengths(inputs: list[Path]) -> Path | None:
    """A folder of packed_lengths files beside the inputs, if there is one."""
    for path in inputs:
        for candidate in (
            path.with_name(path.stem + "_lengths"),
            path / "lengths",
            path.parent / "lengths",
        ):
            if candidate.is_dir() and any(candidate.glob("packed_lengths_step_*.jsonl")):
                return candidate
    return None


@app.command(context_settings={"allow_interspersed_args": False})
def profile(
    command: Annotated[list[str], typer.Argument(help="The workload: -- CMD [ARGS...]")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for reports and analysis.")
    ] = Path("profile_out"),
    power: Annotated[
        bool,
        typer.Option(help="Sample GPU power with NVML around the workload (nvtx-phases[power])."),
    ] = False,
    trace: Annotated[
        str, typer.Option(help="APIs to trace (those this nsys lacks are left out, with a note).")
    ] = "cuda,nvtx,osrt,cublas",
    sample_cpu: Annotated[
        bool, typer.Option(help="CPU sampling and context switches (bigger files; off by default).")
    ] = False,
    gpu_metrics: Annotated[
        bool, typer.Option(help="GPU metrics, when a GPU supports them.")
    ] = True,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds before the run is stopped (default: none).")
    ] = None,
    nsys: Annotated[
        str | None, typer.Option(help="nsys executable (default: $NSYS or PATH).")
    ] = None,
    analyze_after: Annotated[
        bool, typer.Option("--analyze/--no-analyze", help="Analyze the exports afterwards.")
    ] = True,
    max_rows: Annotated[int, typer.Option(help="Rows of the printed table.")] = 60,
) -> None:
    """Run CMD under nsys (defaults for RL runs), export SQLite, and analyze it.

    Example: nvtx-phases profile --out prof -- python -m nvtx_phases.workload --steps 3
    """
    from nvtx_phases.nsys import ProfileOptions, find_nsys
    from nvtx_phases.nsys import profile as run_profile

    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise _fail("no command to profile (… profile [OPTIONS] -- CMD ...)")
    found = find_nsys(nsys)
    workload = list(command)
    if power:
        import socket

        samples = out / f"power_{socket.gethostname()}.parquet"
        workload = [
            sys.executable,
            "-m",
            "nvtx_phases.power_run",
            "--out",
            str(samples),
            "--",
            *workload,
        ]
    options = ProfileOptions(
        traces=tuple(t for t in trace.split(",") if t),
        cpu_sampling=sample_cpu,
        gpu_metrics=gpu_metrics,
    )
    console.print(f"nsys {found.version}: profiling {' '.join(command)}")
    result = run_profile(workload, out, options=options, nsys=found, timeout_s=timeout)
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    for report, export in zip(result.reports, result.exports, strict=True):
        console.print(f"report {report}  →  {export}")
    if result.exit_code:
        err_console.print(f"the workload exited with status {result.exit_code}; reports kept")
    if analyze_after:
        _analyze_and_report(list(result.exports), out / "analysis", max_rows=max_rows)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def parse_steps(text: str) -> list[int]:
    """Step numbers from ``--steps 1,2,3``: integers ≥ 1, comma-separated (else exit 2)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]+", part) and int(part) >= 1 for part in parts):
        raise _fail(f"--steps takes step numbers >= 1, comma-separated (e.g. 1,2,3), not '{text}'")
    return [int(part) for part in parts]


@app.command("verl-config")
def verl_config(
    save_path: Annotated[
        str, typer.Option(help="Where VeRL writes its nsys reports.")
    ] = "outputs/profile",
    steps: Annotated[str, typer.Option(help="Steps to profile, comma-separated.")] = "1,2,3",
) -> None:
    """Print the VeRL (0.9.1) overrides that run its Ray workers under nsys like `profile`."""
    from nvtx_phases.nsys import verl_overrides

    for line in verl_overrides(save_path, parse_steps(steps)):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def synth(
    out: Annotated[Path, typer.Argument(help="Output .sqlite file (or folder with --split).")],
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 3,
    ranks: Annotated[int, typer.Option(min=1, help="Worker ranks (one GPU each).")] = 2,
    kernels: Annotated[int, typer.Option(min=2, help="Compute kernels per worker phase.")] = 40,
    seed: Annotated[int, typer.Option(help="Random seed (the run is deterministic).")] = 7,
    reward_model: Annotated[
        bool, typer.Option(help="Score with a reward model on the GPUs (else a CPU rule function).")
    ] = False,
    power: Annotated[bool, typer.Option(help="Also write NVML-style power samples.")] = True,
    lengths: Annotated[
        bool, typer.Option(help="Also write response-length records (PolyTrace layout).")
    ] = True,
    split: Annotated[
        bool, typer.Option(help="One export per process, with staggered session starts.")
    ] = False,
    truth: Annotated[bool, typer.Option(help="Also write the ground-truth JSON.")] = True,
    cuda_graphs: Annotated[
        bool | None,
        typer.Option(
            "--cuda-graphs/--no-cuda-graphs",
            help="Decode steps as whole CUDA graph executions (--cuda-graph-trace=graph); "
            "default: off, on with --ray.",
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            help="Ray-style capture into folder OUT: one export per process on its own clock, "
            "a trainer and a rollout process sharing each GPU, every GPU seen as device 0."
        ),
    ] = False,
    gpus: Annotated[int, typer.Option(min=1, max=8, help="GPUs of the --ray capture.")] = 2,
) -> None:
    """Write a synthetic VeRL-like GRPO run as nsys 2022.4 SQLite export(s)."""
    import sqlite3

    from analysis.errors import AnalysisError

    def make() -> list[Path]:
        if ray:
            from analysis.synth.ray import RayConfig, generate_ray

            extra = {} if cuda_graphs is None else {"graphs": cuda_graphs}
            ray_cfg = RayConfig(steps=steps, gpus=gpus, seed=seed, power=power, **extra)
            return generate_ray(out, ray_cfg, with_truth=truth)
        from analysis.synth.build import SynthConfig, generate

        cfg = SynthConfig(
            steps=steps,
            ranks=ranks,
            kernels_per_phase=kernels,
            seed=seed,
            split_files=split,
            reward_model=reward_model,
            power=power,
            lengths=lengths,
            graphs=bool(cuda_graphs),
        )
        return generate(out, cfg, with_truth=truth)

    try:
        written = make()
    except (OSError, sqlite3.Error) as exc:  # where it cannot write: name the output first
        raise AnalysisError(
            f"{out}: cannot write the synthetic run here ({describe_error(exc)})"
        ) from exc
    for path in written:
        console.print(f"wrote {path}")


lengths_app = typer.Typer(
    help="Response lengths (PolyTrace layout): statistics, stragglers, fits, synthetic traces.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(lengths_app, name="lengths")


def _is_analysis_folder(path: Path) -> bool:
    return path.is_dir() and (path / "phases.parquet").exists()


def load_analysis_folder(folder: Path) -> Analysis:
    """:func:`analysis.render.files.load_analysis`; a damaged file in it is an ``AnalysisError``."""
    import polars as pl

    from analysis.errors import AnalysisError
    from analysis.render.files import load_analysis

    try:
        return load_analysis(folder)
    except (pl.exceptions.PolarsError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AnalysisError(
            f"{folder}: cannot read this analysis folder ({_one_line(str(exc))}); "
            "run `nvtx-phases analyze` again"
        ) from exc


def _load_run(run: Path) -> Analysis:
    from analysis.run.pipeline import analyze as run_analysis

    if _is_analysis_folder(run):
        return load_analysis_folder(run)
    with console.status(Text(f"analyzing {run}…")):
        return run_analysis(expand_trace_paths([run]))


@lengths_app.command("analyze")
def lengths_analyze(
    paths: Annotated[
        list[Path], typer.Argument(help="packed_lengths_step_*.jsonl files or folders of them.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for tables and figures.")] = Path(
        "lengths"
    ),
    cap: Annotated[
        int | None, typer.Option(help="Max response length of the rollout (fraction at cap).")
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(help="The run's analysis folder or traces: adds stragglers and imbalance."),
    ] = None,
    fit: Annotated[
        bool | None,
        typer.Option(
            "--fit/--no-fit",
            help="Also fit distributions (needs nvtx-phases[fit]: scipy, scikit-learn). "
            "Default: fit when those are installed, else skip with a note.",
        ),
    ] = None,
    task: Annotated[str, typer.Option(help="Task name for the fitted parameters.")] = "task",
) -> None:
    """Length statistics per step, drift, rank imbalance, figures; stragglers with --run."""
    from analysis.errors import AnalysisError
    from analysis.render.files import atomic_write
    from analysis.render.length_figures import length_cdf, length_heatmap, straggler_timeline
    from analysis.workload.fits import FIT_HINT, missing_fit_dependencies
    from analysis.workload.lengths import (
        drift,
        length_stats,
        rank_imbalance,
        read_packed_lengths,
        read_reward_timings,
    )
    from analysis.workload.stragglers import energy_per_token, generation_tails, phase_imbalance

    missing = missing_fit_dependencies() if fit is not False else []
    if missing and fit:  # asked for explicitly
        raise AnalysisError(f"length fits need {' and '.join(missing)}: {FIT_HINT}")
    if missing:  # the default: everything else works without them
        err_console.print(
            Text(
                f"note: length fits skipped: they need {' and '.join(missing)} ({FIT_HINT}); "
                "--no-fit skips them quietly"
            ),
            soft_wrap=True,
        )
    fit = fit is not False and not missing

    responses = read_packed_lengths(paths)
    rewards = read_reward_timings(paths)
    stats = length_stats(responses, cap=cap)
    written = [
        atomic_write(out / "length_stats.csv", stats.write_csv),
        atomic_write(out / "length_drift.csv", drift(stats).write_csv),
        atomic_write(out / "rank_imbalance.csv", rank_imbalance(responses, rewards).write_csv),
        *length_cdf(responses, out / "figures"),
        *length_heatmap(responses, out / "figures"),
    ]
    if run is not None:
        analysis = _load_run(run)
        tails = generation_tails(analysis, stats)
        written += [
            atomic_write(out / "stragglers.csv", tails.write_csv),
            atomic_write(out / "phase_imbalance.csv", phase_imbalance(analysis).write_csv),
            atomic_write(out / "energy_per_token.csv", energy_per_token(analysis, stats).write_csv),
            *straggler_timeline(tails, out / "figures"),
        ]
    if fit:
        from analysis.workload.fits import fit_task, parameter_file

        params = parameter_file(
            {task: fit_task(responses, task)}, source=", ".join(map(str, paths))
        )
        written.append(
            atomic_write(out / "fits.json", lambda p: p.write_text(json.dumps(params, indent=2)))
        )
    from rich.table import Table

    table = Table(title=f"Response lengths per step ({responses.height:,} responses)")
    for column in ("step", "n", "mean", "p50", "p90", "p99", "max", "max/mean", "CV", "at cap"):
        table.add_column(column, justify="right")
    for row in stats.iter_rows(named=True):
        table.add_row(
            str(row["step"]),
            f"{row['n_responses']:,}",
            f"{row['mean']:,.1f}",
            f"{row['p50']:,.0f}",
            f"{row['p90']:,.0f}",
            f"{row['p99']:,.0f}",
            f"{row['max']:,}",
            f"{row['max_over_mean']:.1f}",
            f"{row['cv']:.2f}",
            "" if row["frac_at_cap"] is None else f"{row['frac_at_cap']:.1%}",
        )
    console.print(table)
    console.print(f"wrote {len(written)} files to {out}/")


@lengths_app.command("fit")
def lengths_fit(
    paths: Annotated[list[Path], typer.Argument(help="packed_lengths files or folders, one task.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Parameter file (JSON).")] = Path(
        "length_params.json"
    ),
    task: Annotated[str, typer.Option(help="Task name.")] = "task",
) -> None:
    """Fit lognormal marginals and a joint Gaussian mixture (PolyTrace parameter layout)."""
    from analysis.workload.fits import fit_task, parameter_file
    from analysis.workload.lengths import read_packed_lengths

    params = parameter_file(
        {task: fit_task(read_packed_lengths(paths), task)}, ", ".join(map(str, paths))
    )
    out.write_text(json.dumps(params, indent=2) + "\n", encoding="utf-8")
    fitted = params[f"{task}_task"]
    console.print(
        f"{task}: output lognorm KS={fitted['output_distribution']['ks_statistic']:.3f}, "
        f"mixture of {fitted['joint_distribution']['n_components']} → {out}"
    )


@lengths_app.command("sample")
def lengths_sample(
    params: Annotated[Path, typer.Argument(help="Parameter file from `lengths fit`.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder for packed_lengths files.")
    ] = Path("sampled_lengths"),
    task: Annotated[str | None, typer.Option(help="Task to sample (default: the first).")] = None,
    steps: Annotated[int, typer.Option(min=1)] = 10,
    prompts: Annotated[int, typer.Option(min=1, help="Prompts per step.")] = 64,
    n_sampling: Annotated[int, typer.Option(min=1, help="Responses per prompt.")] = 8,
    dp_size: Annotated[int, typer.Option(min=1, help="DP ranks to spread prompts over.")] = 1,
    cap: Annotated[int | None, typer.Option(help="Max response length.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Write synthetic packed_lengths_step_{S}.jsonl files sampled from fitted parameters."""
    from analysis.workload.fits import read_parameter_file, write_sampled_steps

    tasks = read_parameter_file(params)
    name = task or next(iter(tasks))
    if name not in tasks:
        raise _fail(f"{params}: no task '{name}' (has {', '.join(tasks)})")
    written = write_sampled_steps(
        tasks[name],
        out,
        steps=steps,
        prompts=prompts,
        n_sampling=n_sampling,
        dp_size=dp_size,
        seed=seed,
        cap=cap,
    )
    console.print(f"wrote {len(written)} step files to {out}/")


@app.command()
def fidelity(
    run: Annotated[Path, typer.Argument(help="The run's analysis folder or traces.")],
    log: Annotated[Path, typer.Option("--log", help="VeRL console log or file-logger JSON lines.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the comparison.")] = Path(
        "fidelity"
    ),
) -> None:
    """Trace phase times vs VeRL's timing_s/* per step: error %, accuracy per stage and overall."""
    from analysis.render.files import atomic_write
    from analysis.workload.fidelity import compare_with_log, read_verl_log, to_markdown

    logged = read_verl_log(log)  # first: a missing log fails before a long analysis
    per_step, summary = compare_with_log(_load_run(run), logged)
    text = to_markdown(summary)
    atomic_write(out / "fidelity_steps.csv", per_step.write_csv)
    atomic_write(out / "summary.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
    atomic_write(out / "summary.md", lambda p: p.write_text(text))
    console.print(text, markup=False, highlight=False)


def main() -> None:
    """Console-script entry point (errors: see :func:`error_boundary`)."""
    try:
        app()
    except KeyboardInterrupt:  # before a command started (imports, option parsing)
        _print_error("error:", "interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
