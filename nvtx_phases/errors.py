"""Named errors of the capture side (stdlib only): what a user can fix about nsys or VeRL."""

from __future__ import annotations


class CaptureError(Exception):
    """Base class of the capture side's errors; the CLI prints each as one line, exit 2."""


class NsysError(CaptureError):
    """nsys is missing, failed, or timed out; the message says which and what to do."""


class HookError(CaptureError):
    """A hook target is missing from the installed VeRL (another release moved it)."""
