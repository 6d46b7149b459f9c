"""Record prompt and response lengths of a VeRL batch in PolyTrace's packed_lengths layout.

From the batch VeRL 0.9.1's ``AgentLoopManager.generate_sequences`` returns: ``prompts`` [B, P],
``responses`` [B, R] and ``attention_mask`` [B, P+R]; a prompt's length is its mask's sum over the
first P columns, a response's over the rest. Responses of one prompt are grouped by the batch's
``uid`` when it has one, else in consecutive blocks of ``n_sampling`` (VeRL repeats prompts
interleaved). DP ranks get contiguous slices of the batch (``dp_size``, default 1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LENGTHS_DIR_ENV = "NVTX_PHASES_LENGTHS_DIR"
DP_SIZE_ENV = "NVTX_PHASES_DP_SIZE"
N_SAMPLING_ENV = "NVTX_PHASES_N_SAMPLING"


def batch_lengths(batch: Any) -> tuple[list[int], list[int], list[Any] | None]:
    """Prompt lengths, response lengths, and uids (or None) of a VeRL DataProto."""
    tensors = batch.batch
    prompt_width = tensors["prompts"].shape[1]
    mask = tensors["attention_mask"]
    prompt_lens = mask[:, :prompt_width].sum(dim=1).tolist()
    response_lens = mask[:, prompt_width:].sum(dim=1).tolist()
    uids = batch.non_tensor_batch.get("uid") if getattr(batch, "non_tensor_batch", None) else None
    return (
        [int(x) for x in prompt_lens],
        [int(x) for x in response_lens],
        (list(uids) if uids is not None else None),
    )


def packed_rows(
    prompt_lens: list[int],
    response_lens: list[int],
    uids: list[Any] | None,
    *,
    step: int,
    dp_size: int = 1,
    n_sampling: int = 1,
    validate: bool = False,
) -> list[dict]:
    """One packed_lengths row per prompt."""
    size = len(response_lens)
    groups: list[list[int]] = []
    if uids is not None:
        index: dict[Any, int] = {}
        for i, uid in enumerate(uids):
            if uid not in index:
                index[uid] = len(groups)
                groups.append([])
            groups[index[uid]].append(i)
    else:
        groups = [
            list(range(i, min(i + n_sampling, size))) for i in range(0, size, max(n_sampling, 1))
        ]
    rows = []
    local: dict[int, int] = {}
    for members in groups:
        dp_rank = members[0] * dp_size // max(size, 1)
        rows.append(
            {
                "step": step,
                "rank": dp_rank,
                "dp_rank": dp_rank,
                "tp_rank": 0,
                "local_index": local.setdefault(dp_rank, 0),
                "input": prompt_lens[members[0]],
                "output": [response_lens[i] for i in members],
                "n_sampling": len(members),
                "validate": validate,
            }
        )
        local[dp_rank] += 1
    return rows


def record_lengths(
    batch: Any, step: int, out_dir: str | Path, *, dp_size: int = 1, n_sampling: int = 1
) -> Path:
    """Write ``packed_lengths_step_{step}.jsonl`` for one generated batch."""
    rows = packed_rows(*batch_lengths(batch), step=step, dp_size=dp_size, n_sampling=n_sampling)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"packed_lengths_step_{step}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_reward_timings(folder: str | Path, step: int, reward_time_s: float) -> Path | None:
    """Write ``reward_timings_step_{step}.jsonl`` from that step's recorded lengths.

    The trainer times ``reward`` once for the whole batch in the driver, so every DP rank gets
    that time; the response sums, means and maxima are per rank. None when no lengths were
    recorded for the step.
    """
    folder = Path(folder)
    packed = folder / f"packed_lengths_step_{step}.jsonl"
    if not packed.exists():
        return None
    per_rank: dict[int, list[int]] = {}
    for line in packed.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        per_rank.setdefault(int(row["dp_rank"]), []).extend(int(x) for x in row["output"])
    rows = [
        {
            "step": step,
            "rank": rank,
            "tp_rank": 0,
            "dp_rank": rank,
            "batch_size": len(lengths),
            "reward_time_s": reward_time_s,
            "response_sum": sum(lengths),
            "response_mean": sum(lengths) / len(lengths),
            "response_max": max(lengths),
            "validate": False,
        }
        for rank, lengths in sorted(per_rank.items())
        if lengths
    ]
    path = folder / f"reward_timings_step_{step}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def settings_from_env() -> tuple[str | None, int, int]:
    """(output folder or None when recording is off, dp_size, n_sampling) from the environment."""
    return (
        os.environ.get(LENGTHS_DIR_ENV) or None,
        int(os.environ.get(DP_SIZE_ENV, "1")),
        int(os.environ.get(N_SAMPLING_ENV, "1")),
    )
