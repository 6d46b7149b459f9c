"""``python -m analysis.cli``: the ``nvtx-phases`` command."""

from . import main

main()
