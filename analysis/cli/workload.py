"""``lengths`` (analyze, fit, sample) and ``fidelity``: the workload beside the trace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .app import app, console, fail, out_option, print_written, spinner

if TYPE_CHECKING:
    import polars as pl

    from ..workload.lengths import CapChoice

lengths_app = typer.Typer(
    help="Response lengths (PolyTrace layout): statistics, stragglers, fits, synthetic traces.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(lengths_app, name="lengths")

LengthFiles = Annotated[
    list[Path],
    typer.Argument(
        help="Record files or folders of them: packed_lengths_step_*.jsonl (with "
        "reward_timings_step_*.jsonl), multiturn_workload_step_*.jsonl, dapo_filter_indices.jsonl."
    ),
]
Cap = Annotated[
    int | None,
    typer.Option(
        help="Max response length of the rollout (fraction at cap). Default: inferred when at "
        "least 1% of the responses (and 2) share the longest length, else none."
    ),
]
Run = Annotated[
    Path | None,
    typer.Option(help="The run's analysis folder or traces: adds stragglers and imbalance."),
]
Fit = Annotated[
    bool | None,
    typer.Option(
        "--fit/--no-fit",
        help="Also fit distributions (needs nvtx-phases[fit]: scipy, scikit-learn). "
        "Default: fit when those are installed, else skip with a note.",
    ),
]

#: the columns of the printed length table
LENGTH_COLUMNS = ("step", "n", "mean", "p50", "p90", "p99", "max", "max/mean", "CV", "at cap")


def print_length_table(stats: pl.DataFrame, n_responses: int, cap: CapChoice | None = None) -> None:
    """The per-step length statistics as a table, with the cap its "at cap" column uses."""
    from rich.table import Table

    table = Table(
        title=f"Response lengths per step ({n_responses:,} responses)",
        caption=None if cap is None else cap.text(),
        caption_justify="left",
    )
    for column in LENGTH_COLUMNS:
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


#: the printed columns of the multi-turn and DAPO tables: (header, column, format)
MULTITURN = (
    ("step", "step", "{}"),
    ("samples", "samples", "{:,}"),
    ("turns mean", "turns_mean", "{:.2f}"),
    ("p50", "turns_p50", "{:.0f}"),
    ("p90", "turns_p90", "{:.0f}"),
    ("max", "turns_max", "{}"),
    ("tool calls", "tool_calls", "{:,}"),
    ("tool share", "tool_share_of_latency_fraction", "{:.2%}"),
    ("cache hit", "prefix_cache_hit_fraction", "{:.1%}"),
    ("loss-masked", "loss_masked_fraction", "{:.1%}"),
    ("slowest 10% turns", "slowest_decile_turns_mean", "{:.2f}"),
)
DAPO = (
    ("trainer step", "trainer_step", "{}"),
    ("gen batches", "generation_batches", "{}"),
    ("generated", "prompts_generated", "{:,}"),
    ("kept", "prompts_kept", "{:,}"),
    ("used", "prompts_used", "{:,}"),
    ("kept/generated", "kept_of_generated_fraction", "{:.1%}"),
    ("used/kept", "used_of_kept_fraction", "{:.1%}"),
    ("batch filled", "batch_filled", "{}"),
)


def print_frame(title: str, frame: pl.DataFrame, columns: tuple[tuple[str, str, str], ...]) -> None:
    """Some columns of ``frame`` as a table; a null shows as "n/a"."""
    from rich.table import Table

    table = Table(title=title)
    for header, _, _ in columns:
        table.add_column(header, justify="right")
    for row in frame.iter_rows(named=True):
        table.add_row(*("n/a" if row[c] is None else f.format(row[c]) for _, c, f in columns))
    console.print(table)


def print_warnings(warnings: list[str]) -> None:
    """Each warning as one ``warning: …`` line."""
    from rich.text import Text

    for warning in warnings:
        console.print(Text("warning: " + warning, style="yellow"), soft_wrap=True)


@lengths_app.command("analyze")
def lengths_analyze(
    paths: LengthFiles,
    out: Annotated[Path, out_option("Folder for tables and figures.")] = Path("lengths"),
    cap: Cap = None,
    run: Run = None,
    fit: Fit = None,
    task: Annotated[str, typer.Option(help="Task name for the fitted parameters.")] = "task",
) -> None:
    """Length statistics per step, drift, rank imbalance, figures; stragglers with --run.

    Multi-turn tool-use records add multiturn_*.csv, DAPO filter records dapo_steps.csv.
    """
    from ..jobs import analyze_lengths

    with spinner(details=False) as reporter:
        done = analyze_lengths(paths, out, cap=cap, run=run, fit=fit, task=task, reporter=reporter)
    if done.stats is not None:
        print_length_table(done.stats, done.n_responses, done.cap)
    if done.multiturn is not None:
        print_frame("Multi-turn rollouts per step (multiturn_steps.csv)", done.multiturn, MULTITURN)
    if done.dapo is not None:
        print_frame("DAPO filtering per trainer step (dapo_steps.csv)", done.dapo, DAPO)
    for line in done.notes:
        console.print(f"note: {line}", soft_wrap=True, markup=False)
    print_warnings(done.warnings)
    print_written(done.written, out)


@lengths_app.command("fit")
def lengths_fit(
    paths: Annotated[list[Path], typer.Argument(help="packed_lengths files or folders, one task.")],
    out: Annotated[Path, out_option("Parameter file (JSON).")] = Path("length_params.json"),
    task: Annotated[str, typer.Option(help="Task name.")] = "task",
) -> None:
    """Fit lognormal marginals and a joint Gaussian mixture (PolyTrace parameter layout)."""
    from ..jobs import fit_lengths
    from ..workload.fits import refused_fit_lines

    fitted = fit_lengths(paths, out, task=task)
    ks = fitted["output_distribution"]["ks_statistic"]
    console.print(
        f"{task}: output lognorm "
        + (f"KS={ks:.3f}" if ks is not None else "refused")
        + f", mixture of {fitted['joint_distribution']['n_components']} → {out}"
    )
    print_warnings(refused_fit_lines(fitted))


@lengths_app.command("sample")
def lengths_sample(
    params: Annotated[Path, typer.Argument(help="Parameter file from `lengths fit`.")],
    out: Annotated[Path, out_option("Folder for packed_lengths files.")] = Path("sampled_lengths"),
    task: Annotated[str | None, typer.Option(help="Task to sample (default: the first).")] = None,
    steps: Annotated[int, typer.Option(min=1)] = 10,
    prompts: Annotated[int, typer.Option(min=1, help="Prompts per step.")] = 64,
    n_sampling: Annotated[int, typer.Option(min=1, help="Responses per prompt.")] = 8,
    dp_size: Annotated[int, typer.Option(min=1, help="DP ranks to spread prompts over.")] = 1,
    cap: Annotated[int | None, typer.Option(help="Max response length.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Write synthetic packed_lengths_step_{S}.jsonl files sampled from fitted parameters."""
    from ..workload.fits import read_parameter_file, write_sampled_steps

    tasks = read_parameter_file(params)
    name = task or next(iter(tasks))
    if name not in tasks:
        raise fail(f"{params}: no task '{name}' (has {', '.join(tasks)})")
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
    out: Annotated[Path, out_option("Folder for the comparison.")] = Path("fidelity"),
) -> None:
    """Trace phase times vs VeRL's timing_s/* per step: error %, accuracy per stage and overall."""
    from ..jobs import fidelity_to
    from ..workload.fidelity import to_markdown

    with spinner(details=False) as reporter:
        done = fidelity_to(run, log, out, reporter=reporter)
    # the table without summary.md's warning paragraph: the warning is the last line here
    console.print(to_markdown(done.summary, warning=False), markup=False, highlight=False)
    print_warnings(done.warnings)
