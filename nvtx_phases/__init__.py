"""Capture side of nvtx-phases: NVTX phase marking, VeRL hooks, nsys launch, power sampling.

Imported inside training workers, so it stays light: the standard library and ``nvtx`` only.
"""

from nvtx_phases.naming import DOMAIN, PATH_SEP, STEP

__all__ = ["DOMAIN", "PATH_SEP", "STEP"]
__version__ = "0.1.0"
