"""``analyze`` and ``report``: one run's tables, figures, printed phase table and HTML report."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer
from rich.text import Text

from .app import (
    ForceCombine,
    app,
    command_line,
    console,
    fail,
    note,
    out_option,
    print_written,
    spinner,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..jobs import AnalysisOutputs, Reporter
    from ..options import Engine

Traces = Annotated[
    list[Path],
    typer.Argument(
        help="Traces of one run: nsys SQLite exports, parquetdir folders, .nsys-rep/.qdrep "
        "reports (exported first), PyTorch profiler (Kineto) .json/.json.gz traces (one per "
        "rank), or folders of them."
    ),
]
PhaseMapFile = Annotated[
    Path | None,
    typer.Option("--phase-map", help="TOML file that extends or renames the phase names."),
]
AllRanges = Annotated[bool, typer.Option("--all-ranges", help="Treat every NVTX range as a phase.")]
Steps = Annotated[
    str | None,
    typer.Option(
        "--steps",
        help="Only these steps: N, A:B (both included), A:, :B, or a comma list (1,3,7); "
        "2: skips a warm-up step 1. Totals count the selected steps' GPU operations.",
    ),
]
DetailSteps = Annotated[
    str | None,
    typer.Option(
        "--detail-steps",
        help="Steps drawn in power_timeline_detail, same syntax as --steps (at most 4); "
        "default: the median-duration and the longest step.",
    ),
]
PoolOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pool",
        help="A GPU pool of an asynchronous run, NAME=PATTERN[,PATTERN...] (repeat per pool): "
        "file stems, process names or GPUs as globs, or pid:N. Default: the processes' pool "
        "marks (nvtx_phases.pools), else inferred when driver phases of two processes overlap.",
    ),
]
StripArgs = Annotated[
    bool,
    typer.Option(
        "--strip-args",
        help="Cut ', key = value' suffixes off range names (PyTorch: 'aten::mm, op_id = 12' "
        "reads 'aten::mm'), so --all-ranges groups an operator's calls.",
    ),
]
Power = Annotated[
    list[Path] | None,
    typer.Option(
        "--power",
        help="Power samples: the NVML sampler's Parquet, or a log of nvidia-smi --query-gpu "
        "(CSV), dcgmi dmon (lines stamped with a time) or Zeus PowerMonitor (CSV); options after "
        "the name: 'smi.csv,tz=UTC' (also host=, gpus=0+1, columns=, format=). Default: "
        "<trace>.power.parquet and power_*.parquet beside the traces.",
    ),
]
NoPower = Annotated[bool, typer.Option("--no-power", help="Ignore power samples.")]
IdlePower = Annotated[
    float | None,
    typer.Option(help="Idle power per GPU (W) for energy above idle; default: measured."),
]
Figures = Annotated[bool, typer.Option(help="Write figures under OUT/figures.")]
MaxRows = Annotated[int, typer.Option(help="Rows of the printed table (all go to files).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print no table.")]
Jobs = Annotated[
    int, typer.Option("--jobs", "-j", min=1, help="Read this many exports in parallel.")
]
EngineName = Annotated[
    str,
    typer.Option(
        help="Where parallel reads run: 'process' (a local pool) or 'ray' (Ray tasks; an "
        "existing cluster via RAY_ADDRESS). Results are the same."
    ),
]
ChunkOps = Annotated[
    int | None,
    typer.Option(
        min=1000,
        help="Most GPU operations held in memory at once (default 2,000,000: peak about 1.7 GB). "
        "Bigger runs spill to Parquet and are attributed in time buckets; same result.",
    ),
]
SpillDir = Annotated[
    Path | None,
    typer.Option(
        help="Folder for spilled operations (default: the system temp folder; with "
        "--engine ray on a cluster, a shared file system)."
    ),
]

VerlLogs = Annotated[
    list[Path] | None,
    typer.Option(
        "--verl-log",
        help="VeRL's console log or file-logger JSON lines of the run (repeat for resumed "
        "segments, in order): tokens per step from perf/total_num_tokens and the prompt and "
        "response length means, for tokens_energy.csv (J per token per phase).",
    ),
]
TokenLengths = Annotated[
    Path | None,
    typer.Option(
        "--lengths",
        help="Response-length records (PolyTrace layout) of the run: tokens per step for "
        "tokens_energy.csv (used over --verl-log where both give a step).",
    ),
]

TopKernels = Annotated[
    int,
    typer.Option(
        "--top-kernels",
        min=0,
        help="Kernel names per phase in kernels_by_phase.csv, by GPU time (0: all).",
    ),
]


@contextmanager
def read_bar() -> Iterator[Reporter]:
    """A reporter with a transient progress bar over the exports, from when reading begins."""
    from ..jobs import Reporter

    bar: Progress | None = None
    task: TaskID | None = None

    def begin(total: int) -> None:
        nonlocal bar, task
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
        bar = Progress(*columns, console=console, transient=True)
        bar.start()
        task = bar.add_task("reading exports", total=total)

    def describe(text: str) -> None:
        if bar is not None and task is not None:
            bar.update(task, description=text)

    def file_done(label: str) -> None:
        if bar is not None and task is not None:
            bar.update(task, advance=1, description=f"read {label}")

    try:
        yield Reporter(note=note, stage=describe, detail=describe, begin=begin, file_done=file_done)
    finally:
        if bar is not None:
            bar.stop()


def pools_from(values: list[str] | None) -> dict[str, tuple[str, ...]] | None:
    """``--pool`` values → the ``pools`` option (None when none is given)."""
    if not values:
        return None
    from ..attribute.pools import parse_pool_option

    return parse_pool_option(values)


def analyze_and_print(
    run: Callable[[Reporter], AnalysisOutputs], out: Path, *, max_rows: int, quiet: bool = False
) -> None:
    """Run ``run`` (an :func:`analysis.jobs.analyze_to` call) under a progress bar; print.

    Prints the phase table (``quiet``: only the warnings), then ``wrote N files to OUT/``.
    """
    with read_bar() as reporter:
        done = run(reporter)
    with done:
        if not quiet:
            from ..render.terminal import print_report

            print_report(done.analysis, console, max_rows=max_rows)
        else:  # quiet drops the table, never the warnings
            for warning in done.analysis.warnings:
                console.print(Text("warning: " + warning, style="yellow"))
    print_written(done.written, out)


@app.command()
def analyze(
    ctx: typer.Context,
    traces: Traces,
    out: Annotated[Path, out_option("Folder for tables and figures.")] = Path("out"),
    phase_map: PhaseMapFile = None,
    all_ranges: AllRanges = False,
    power: Power = None,
    no_power: NoPower = False,
    idle_power_w: IdlePower = None,
    figures: Figures = True,
    max_rows: MaxRows = 60,
    quiet: Quiet = False,
    jobs: Jobs = 1,
    engine: EngineName = "process",
    chunk_ops: ChunkOps = None,
    spill_dir: SpillDir = None,
    force_combine: ForceCombine = False,
    top_kernels: TopKernels = 10,
    steps: Steps = None,
    strip_args: StripArgs = False,
    detail_steps: DetailSteps = None,
    pool: PoolOption = None,
    verl_log: VerlLogs = None,
    lengths: TokenLengths = None,
) -> None:
    """Attribute GPU kernels, NCCL, memcpy, memset and energy to NVTX phases, per step and rank.

    Writes OUT/phases.parquet|csv, phase_devices.parquet, gpu_activity.parquet, kernels.csv,
    kernels_by_phase.csv, steps.csv and summary.json, then prints the per-step phase table.
    With power samples, the phases also get energy_j, avg/peak power and energy above idle.
    With --verl-log or --lengths, step_tokens.csv and tokens_energy.csv: tokens, J per token and
    tokens per J per phase and step, inference-type vs training-type mean power.
    """
    if engine not in ("process", "ray"):
        raise fail(f"--engine must be 'process' or 'ray', not '{engine}'")
    from ..jobs import analyze_to
    from ..options import AnalyzeOptions
    from ..render.figures.drawing import default_workers

    options = AnalyzeOptions(  # built once, here; a bad --steps or --phase-map fails first
        phase_map=phase_map,
        all_ranges=all_ranges,
        strip_args=strip_args,
        power_files=[] if no_power else power,
        idle_power_w=idle_power_w,
        jobs=jobs,
        engine=cast("Engine", engine),
        **({"chunk_ops": chunk_ops} if chunk_ops else {}),
        spill_dir=spill_dir,
        force_combine=force_combine,
        steps=steps,
        pools=pools_from(pool),
    )
    analyze_and_print(
        lambda reporter: analyze_to(
            traces,
            out,
            options,
            figures=figures,
            top_kernels=top_kernels,
            command_line=command_line(ctx),
            detail_steps=detail_steps,
            draw_workers=default_workers(),
            lengths=lengths,
            verl_logs=verl_log or (),
            reporter=reporter,
        ),
        out,
        max_rows=max_rows,
        quiet=quiet,
    )


@app.command()
def report(
    ctx: typer.Context,
    inputs: Annotated[
        list[Path],
        typer.Argument(help="An analysis folder (from `analyze`), or the traces of one run."),
    ],
    out: Annotated[Path, out_option("Folder for the report.")] = Path("report"),
    idle_power_w: Annotated[
        float | None, typer.Option(help="Idle power per GPU (W); default: measured.")
    ] = None,
    lengths: Annotated[
        Path | None,
        typer.Option(
            help="Record files (PolyTrace layout: response lengths, multi-turn, DAPO filter); "
            "default: <trace>_lengths/ or lengths/ beside the inputs."
        ),
    ] = None,
    cap: Annotated[int | None, typer.Option(help="Max response length (fraction at cap).")] = None,
    force_combine: ForceCombine = False,
    steps: Steps = None,
    detail_steps: DetailSteps = None,
    phase_map: PhaseMapFile = None,
    all_ranges: AllRanges = False,
    strip_args: StripArgs = False,
    pool: PoolOption = None,
    verl_log: VerlLogs = None,
) -> None:
    """Write report.html (self-contained) and report.md: metadata, phase table, figures, warnings.

    With response-length records, also length statistics per step and rollout stragglers; with
    multi-turn or DAPO-filter records, their tables; with length records or --verl-log, tokens
    and energy per phase and step (J per token, inference vs training power).
    --phase-map, --all-ranges and --strip-args apply to traces (as with analyze); an analysis
    folder keeps the options it was analyzed with.
    """
    from ..jobs import build_report
    from ..options import AnalyzeOptions
    from ..render.figures.drawing import default_workers

    options = AnalyzeOptions(
        phase_map=phase_map,
        all_ranges=all_ranges,
        strip_args=strip_args,
        idle_power_w=idle_power_w,
        force_combine=force_combine,
        steps=steps,
        pools=pools_from(pool),
    )
    with spinner() as reporter:
        written = build_report(
            inputs,
            out,
            options,
            lengths=lengths,
            cap=cap,
            verl_logs=verl_log or (),
            command_line=command_line(ctx),
            detail_steps=detail_steps,
            draw_workers=default_workers(),
            reporter=reporter,
        )
    for path in written:
        console.print(f"wrote {path}")
