"""``python -m analysis.cli``: the ``nvtx-phases`` command."""

from analysis.cli import main

main()
