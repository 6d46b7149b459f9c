"""What one VeRL hook wraps: a module's function or method, and the range it marks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    """One function or method to wrap in a range named ``phase``."""

    module: str
    qualname: str
    phase: str
    #: The module needs an optional backend (vLLM, Megatron…): skip it when it cannot import.
    optional: bool = False

    @property
    def target(self) -> str:
        """Dotted path of the wrapped attribute."""
        return f"{self.module}.{self.qualname}"
