"""``nvtx-phases``: the command line. :data:`app` is the typer app, :func:`main` the console script.

Importing this package registers every command on :data:`app`, one module per group; the import
order below is the order ``nvtx-phases --help`` lists them.
"""

# isort: off
from . import analyze, compare, capture, synth, workload, logs, whatif, timeline, study  # noqa: F401  (registers)

# isort: on
from .app import app, main

__all__ = ["app", "main"]
