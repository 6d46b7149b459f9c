"""A small built-in workload shaped like one GRPO training step, doing real CPU work.

Each step runs ``gen`` (rollout: ``weight_sync`` then ``generation`` of a few sequences of
uneven length), ``reward`` (a rule-based ``reward_fn``), ``old_log_prob``, ``ref``, ``adv`` and
``update_actor`` (``micro_batch`` × N, each ``forward``/``backward``, then ``optimizer_step``),
all marked with :mod:`nvtx_phases.marking`. It exists so ``make profile`` and the tests can
record a real nsys trace on a machine without a GPU; the expected structure is
:func:`expected_paths`.

Run: ``python -m nvtx_phases.workload --steps 3 [--jsonl ranges.jsonl]``.
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter

from nvtx_phases.marking import phase, record_to, step

PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
MICRO_BATCHES = 2
SEQUENCES = 4


def _burn(units: int, seed: bytes) -> bytes:
    """Real CPU work: ``units`` rounds of SHA-256 (about 1 µs each)."""
    digest = seed
    for _ in range(units):
        digest = hashlib.sha256(digest).digest()
    return digest


def run_step(index: int, *, scale: int = 1) -> None:
    """One training step with every phase and subphase."""
    unit = 2000 * scale
    with step(index):
        with phase("gen"):
            with phase("weight_sync"):
                _burn(unit // 2, b"w")
            with phase("generation"):
                for seq in range(SEQUENCES):  # uneven response lengths, as in real rollouts
                    _burn(unit * (1 + seq) // 2, bytes([seq]))
        with phase("reward"), phase("reward_fn"):
            _burn(unit // 2, b"r")
        with phase("old_log_prob"), phase("forward"):
            _burn(unit, b"o")
        with phase("ref"), phase("forward"):
            _burn(unit, b"f")
        with phase("adv"):
            _burn(unit // 4, b"a")
        with phase("update_actor"):
            for mb in range(MICRO_BATCHES):
                with phase("micro_batch"):
                    with phase("forward"):
                        _burn(unit, bytes([mb]))
                    with phase("backward"):
                        _burn(2 * unit, bytes([mb]))
            with phase("optimizer_step"):
                _burn(unit // 2, b"s")


def expected_paths(steps: int) -> Counter[str]:
    """How many ranges of each path :func:`run_step` emits over ``steps`` steps."""
    per_step = Counter(
        {
            "step": 1,
            "step/gen": 1,
            "step/gen/weight_sync": 1,
            "step/gen/generation": 1,
            "step/reward": 1,
            "step/reward/reward_fn": 1,
            "step/old_log_prob": 1,
            "step/old_log_prob/forward": 1,
            "step/ref": 1,
            "step/ref/forward": 1,
            "step/adv": 1,
            "step/update_actor": 1,
            "step/update_actor/micro_batch": MICRO_BATCHES,
            "step/update_actor/micro_batch/forward": MICRO_BATCHES,
            "step/update_actor/micro_batch/backward": MICRO_BATCHES,
            "step/update_actor/optimizer_step": 1,
        }
    )
    return Counter({path: n * steps for path, n in per_step.items()})


def main(argv: list[str] | None = None) -> None:
    """Command line: run the workload for a number of steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--first-step", type=int, default=1, help="index of the first step")
    parser.add_argument("--scale", type=int, default=1, help="work per phase multiplier")
    parser.add_argument("--jsonl", help="also record the ranges to this JSON-lines file")
    args = parser.parse_args(argv)
    steps = range(args.first_step, args.first_step + args.steps)
    if args.jsonl:
        with record_to(args.jsonl):
            for index in steps:
                run_step(index, scale=args.scale)
    else:
        for index in steps:
            run_step(index, scale=args.scale)
    print(f"nvtx_phases workload: {args.steps} step(s) done")


if __name__ == "__main__":
    main()
