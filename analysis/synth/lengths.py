"""Response-length records of the synthetic GRPO run, in PolyTrace's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .config import SynthConfig


def write_lengths(
    cfg: SynthConfig, folder: Path, *, prompts: int = 8, n_sampling: int = 4
) -> list[Path]:
    """Write ``packed_lengths_step_{S}.jsonl`` per step in PolyTrace's layout.

    Per rank, lognormal response lengths whose scale follows the rank's generation time (rank 0
    longest), capped at ``cfg.length_cap``.
    """
    rng = np.random.default_rng(cfg.seed + 1000)  # its own stream: the trace stays as it was
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for step in range(1, cfg.steps + 1):
        lines = []
        for rank in range(cfg.ranks):
            scale = 600.0 * (1 - cfg.length_skew * rank / cfg.ranks)
            for index in range(prompts):
                outputs = np.minimum(
                    np.rint(rng.lognormal(np.log(scale), 0.6, n_sampling)), cfg.length_cap
                )
                row = {
                    "step": step,
                    "rank": rank,
                    "dp_rank": rank,
                    "tp_rank": 0,
                    "local_index": index,
                    "input": int(rng.integers(200, 800)),
                    "output": [int(max(o, 1)) for o in outputs],
                    "n_sampling": n_sampling,
                    "validate": False,
                }
                lines.append(json.dumps(row))
        path = folder / f"packed_lengths_step_{step}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written
