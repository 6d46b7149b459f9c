"""Which of the trainer's phases are inference-type and which training-type: declared once here.

*Inference-type* phases run the models forward only: rollout generation (``gen``; ``gen_max``,
older releases' REMAX greedy baseline), reward scoring (``reward``: a reward model's forward
pass, or a rule on the CPU), the old and reference policies' log-probabilities
(``old_log_prob``, ``ref``) and the critic's values (``values``). *Training-type* phases run
forward, backward and the optimizer: ``update_actor``, ``update_critic``. Every other phase
(``adv`` on the driver's CPU, ``update_weights``, ``save_checkpoint``, ``testing``, …) is neither
and has no kind. Names are the canonical names of VeRL's trainer (``marked_timer``) phases, as
the phase table's ``canonical`` column carries them for the driver's ``step/X`` rows.

Lives at the package's top (like :mod:`analysis.phase_paths`) so the tables, the report and the
Python API read the same sets.
"""

from __future__ import annotations

from typing import Final

import polars as pl

INFERENCE: Final = "inference"
TRAINING: Final = "training"
#: forward-only phases of a step
INFERENCE_PHASES: Final = ("gen", "gen_max", "reward", "old_log_prob", "ref", "values")
#: phases that update a model's weights (forward, backward, optimizer step)
TRAINING_PHASES: Final = ("update_actor", "update_critic")


def phase_kind(canonical: str = "canonical") -> pl.Expr:
    """:data:`INFERENCE`, :data:`TRAINING` or null for a row's canonical phase name."""
    col = pl.col(canonical)
    return (
        pl.when(col.is_in(list(INFERENCE_PHASES)))
        .then(pl.lit(INFERENCE))
        .when(col.is_in(list(TRAINING_PHASES)))
        .then(pl.lit(TRAINING))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
