"""The ``nvtx-phases`` typer app: the one error boundary, the consoles, ``main``, shared options.

The commands live one module per group (:mod:`analysis.cli.analyze`, :mod:`~analysis.cli.compare`,
:mod:`~analysis.cli.capture`, :mod:`~analysis.cli.synth`, :mod:`~analysis.cli.workload`) and
register on :data:`app` when :mod:`analysis.cli` is imported. Each parses its options, calls one
function of :mod:`analysis.jobs` (or of the library), and prints.

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

from ..errors import one_line

if TYPE_CHECKING:
    from rich.status import Status

    from ..jobs import Reporter

try:  # typer >= 0.24 ships its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import ClickException  # type: ignore[assignment, unused-ignore]

#: set to 1 to print the traceback of any error along with its one line
DEBUG_ENV = "NVTX_PHASES_DEBUG"

# Piped or captured output (CI logs, `make demo | tee`) has no terminal width; 80 columns would
# squeeze the phase table unreadably, so default to a wide console there (COLUMNS still wins).
# No markup: paths, range names and messages may hold brackets ("nvtx-phases[fit]").
console = Console(
    width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 150, markup=False
)
err_console = Console(stderr=True, markup=False)


def _print_error(label: str, message: str) -> None:
    err_console.print(
        Text.assemble((label, "bold red"), " ", one_line(message)),
        highlight=False,
        soft_wrap=True,
    )


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; return the ``typer.Exit(code)`` to raise.

    For option values only the CLI can judge; everything else raises a named error from
    :mod:`analysis.errors` and lets :func:`error_boundary` print it.
    """
    _print_error("error:", message)
    return typer.Exit(code)


def note(message: str) -> None:
    """Print ``note: message`` on stderr (an export made, an option not applied, …)."""
    err_console.print(Text(f"note: {message}"), soft_wrap=True)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Exception classes that mean "the input or the environment is wrong", not a bug."""
    from ..errors import USER_ERRORS

    return (*USER_ERRORS, OSError, json.JSONDecodeError)


def describe_error(exc: BaseException) -> str:
    """The one-line message for an expected error (JSON that does not parse says so)."""
    from ..errors import describe_error as describe

    if isinstance(exc, json.JSONDecodeError):
        return one_line(f"not valid JSON ({exc})")
    return describe(exc)


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
            f"{type(exc).__name__}: {one_line(str(exc))} (a bug in nvtx-phases: please report "
            f"it with the command line; {DEBUG_ENV}=1 prints the traceback)",
        )
        raise typer.Exit(1) from None


#: ``ctx.meta`` key (shared by every context of one invocation): the arguments as given
ARGS_KEY = "nvtx_phases.args"
PROGRAM = "nvtx-phases"


class ErrorBoundaryGroup(TyperGroup):
    """The root command group: every subcommand (and its option parsing) runs in the boundary."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Parse the root options (``nvtx-phases --bogus``) inside :func:`error_boundary`.

        The arguments are kept first (:data:`ARGS_KEY`) for :func:`command_line`.
        """
        ctx.meta.setdefault(ARGS_KEY, list(args))
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


def _print_version(value: bool) -> None:
    if value:
        from ..model import tool_version

        print(f"{PROGRAM} {tool_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print 'nvtx-phases VERSION' and exit.",
        ),
    ] = False,
) -> None:
    """Where the time, data movement and energy of an RL training step go, phase by phase."""


def command_line(ctx: typer.Context) -> list[str]:
    """The command line as recorded in provenance: ``nvtx-phases`` and its arguments.

    The arguments the root command parsed (``sys.argv[1:]`` for the console script, what a test
    runner passes otherwise), with the program named ``nvtx-phases`` however it was started
    (``python -m analysis.cli``, a path to the script).
    """
    args = ctx.meta.get(ARGS_KEY)
    return [PROGRAM, *(args if args is not None else sys.argv[1:])]


# --- options more than one command takes ---------------------------------------------------------


def out_option(help: str) -> Any:
    """``--out/-o FOLDER`` with this help text (each command has its own default)."""
    return typer.Option("--out", "-o", help=help)


#: ``--force-combine`` (analyze, report)
ForceCombine = Annotated[
    bool,
    typer.Option(
        "--force-combine",
        help="Analyze files together even when they look like different runs (capture "
        "windows apart, or the same process in two files).",
    ),
]


# --- what commands show while they work ----------------------------------------------------------


@contextmanager
def spinner(*, details: bool = True) -> Iterator[Reporter]:
    """A :class:`~analysis.jobs.Reporter` that shows a transient status line and prints notes.

    The status appears with the job's first stage (a run read back from its analysis folder has
    none, and shows none) and follows later stages; with ``details`` also the pipeline's own
    messages. It goes when the block ends.
    """
    from ..jobs import Reporter

    status: Status | None = None

    def stage(text: str) -> None:
        nonlocal status
        if status is None:
            status = console.status(Text(text))
            status.start()
        else:
            status.update(Text(text))

    def detail(text: str) -> None:
        if status is not None and details:
            status.update(text)

    try:
        yield Reporter(note=note, stage=stage, detail=detail)
    finally:
        if status is not None:
            status.stop()


def print_written(written: list[Path], out: Path) -> None:
    """The closing line of a command that wrote a folder: ``wrote N files to OUT/``."""
    console.print(f"wrote {len(written)} files to {out}/")


def main() -> None:
    """Console-script entry point (errors: see :func:`error_boundary`)."""
    try:
        app()
    except KeyboardInterrupt:  # before a command started (imports, option parsing)
        _print_error("error:", "interrupted")
        sys.exit(130)


if __name__ == "__main__":  # python -m analysis.cli.app: the package registers the commands
    from . import main as _main

    _main()
