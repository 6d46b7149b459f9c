"""A fixture, not a stage: synthetic nsys exports with the real schema, for ground truth and scale.

Public surface: :func:`generate` with :class:`SynthConfig` writes the synthetic GRPO run (one
export, or one per process) and its ground truth; :func:`generate_ray` with :class:`RayConfig`
writes a Ray-style capture (:mod:`analysis.synth.ray`); :func:`generate_async` with
:class:`AsyncConfig` an asynchronous, disaggregated one (:mod:`analysis.synth.async_rl`);
:func:`write_lengths` writes response-
length records alone; :data:`TABLES` are the nsys tables every export has.

Modules, one job each: ``constants`` (names and numbers both captures share), ``config`` (the
GRPO run's knobs and layout), ``timeline`` (ranges, GPU operations, the step layout and a trainer
worker range, shared), ``power_model`` (the power model, shared), ``model`` (the GRPO run's
timeline), ``schema`` (the nsys DDL), ``export`` (writing one export, shared), ``truth`` (ground
truth), ``lengths`` (length records), ``memory`` (CUDA memory events, with ``memory``), ``build`` (writing the GRPO run's files); ``ray/`` the same
for the Ray capture, ``async_rl/`` for the asynchronous one.
"""

from .async_rl import AsyncConfig, generate_async
from .build import generate
from .config import SynthConfig
from .lengths import write_lengths
from .ray import RayConfig, generate_ray
from .schema import TABLES

__all__ = [
    "TABLES",
    "AsyncConfig",
    "RayConfig",
    "SynthConfig",
    "generate",
    "generate_async",
    "generate_ray",
    "write_lengths",
]
