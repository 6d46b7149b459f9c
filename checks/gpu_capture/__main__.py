"""``python -m checks.gpu_capture``: run the check (``--help`` lists the options)."""

from __future__ import annotations

import sys

from checks.gpu_capture.runner import main

if __name__ == "__main__":
    sys.exit(main())
