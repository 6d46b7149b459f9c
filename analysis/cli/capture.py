"""``profile`` and ``verl-config``: capture a run under nsys (with the NVML power sampler)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from .app import app, console, err_console, fail, out_option

Power = Annotated[
    bool,
    typer.Option(help="Sample GPU power with NVML around the workload (nvtx-phases[power])."),
]
Trace = Annotated[
    str, typer.Option(help="APIs to trace (those this nsys lacks are left out, with a note).")
]
SampleCpu = Annotated[
    bool, typer.Option(help="CPU sampling and context switches (bigger files; off by default).")
]
GpuMetrics = Annotated[bool, typer.Option(help="GPU metrics, when a GPU supports them.")]
Timeout = Annotated[
    float | None, typer.Option(help="Seconds before the run is stopped (default: none).")
]
NsysPath = Annotated[str | None, typer.Option(help="nsys executable (default: $NSYS or PATH).")]
AnalyzeAfter = Annotated[
    bool, typer.Option("--analyze/--no-analyze", help="Analyze the exports afterwards.")
]


@app.command(context_settings={"allow_interspersed_args": False})
def profile(
    command: Annotated[list[str], typer.Argument(help="The workload: -- CMD [ARGS...]")],
    out: Annotated[Path, out_option("Folder for reports and analysis.")] = Path("profile_out"),
    power: Power = False,
    trace: Trace = "cuda,nvtx,osrt,cublas",
    sample_cpu: SampleCpu = False,
    gpu_metrics: GpuMetrics = True,
    timeout: Timeout = None,
    nsys: NsysPath = None,
    analyze_after: AnalyzeAfter = True,
    max_rows: Annotated[int, typer.Option(help="Rows of the printed table.")] = 60,
) -> None:
    """Run CMD under nsys (defaults for RL runs), export SQLite, and analyze it.

    Example: nvtx-phases profile --out prof -- python -m nvtx_phases.workload --steps 3
    """
    from nvtx_phases.nsys import ProfileOptions, find_nsys

    from ..jobs import profile_workload

    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise fail("no command to profile (… profile [OPTIONS] -- CMD ...)")
    found = find_nsys(nsys)
    options = ProfileOptions(
        traces=tuple(t for t in trace.split(",") if t),
        cpu_sampling=sample_cpu,
        gpu_metrics=gpu_metrics,
    )
    console.print(f"nsys {found.version}: profiling {' '.join(command)}")
    result = profile_workload(
        command, out, nsys=found, options=options, power=power, timeout_s=timeout
    )
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    for report, export in zip(result.reports, result.exports, strict=True):
        console.print(f"report {report}  →  {export}")
    if result.exit_code:
        err_console.print(f"the workload exited with status {result.exit_code}; reports kept")
    if analyze_after:
        from ..jobs import analyze_to
        from ..render.figures.drawing import default_workers
        from .analyze import analyze_and_print

        analysis = out / "analysis"
        analyze_and_print(
            lambda reporter: analyze_to(
                result.exports, analysis, draw_workers=default_workers(), reporter=reporter
            ),
            analysis,
            max_rows=max_rows,
        )
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def parse_steps(text: str) -> list[int]:
    """Step numbers from ``--steps 1,2,3``: integers ≥ 1, comma-separated (else exit 2)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]+", part) and int(part) >= 1 for part in parts):
        raise fail(f"--steps takes step numbers >= 1, comma-separated (e.g. 1,2,3), not '{text}'")
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
