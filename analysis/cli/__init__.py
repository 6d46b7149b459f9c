"""``nvtx-phases``: the command line. :data:`app` is the typer app, :func:`main` the console script."""

from analysis.cli.app import app, main

__all__ = ["app", "main"]
