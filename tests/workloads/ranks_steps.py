"""Two processes that each mark their own ``step`` ranges without payload (the torchrun pattern).

``python ranks_steps.py`` is rank 0; it starts rank 1 (this script, ``--rank 1``) as a child
process, which begins its first step ``DELAY_S`` after rank 0 began its own. Both run ``STEPS``
steps of ``gen`` then ``update_actor`` as plain push/pop NVTX ranges in the default domain, with
no payload, sleeping their own durations (``PLAN``): the analysis must number each process's steps
0, 1, … itself and keep the two processes' steps apart although they are staggered in time.
"""

from __future__ import annotations

import subprocess
import sys
import time

import nvtx

STEPS = 4
#: Seconds slept inside each phase of every step, per rank.
PLAN: dict[int, dict[str, float]] = {
    0: {"gen": 0.060, "update_actor": 0.020},
    1: {"gen": 0.030, "update_actor": 0.045},
}
#: Rank 1 starts this long after rank 0 (its step 0 overlaps rank 0's step 3 in time).
DELAY_S = 0.3


def run(rank: int) -> None:
    """Mark ``STEPS`` steps of this rank's ``PLAN``."""
    for _ in range(STEPS):
        nvtx.push_range("step")
        for name, seconds in PLAN[rank].items():
            nvtx.push_range(name)
            time.sleep(seconds)
            nvtx.pop_range()
        nvtx.pop_range()


def main() -> None:
    """Rank 0 (default) or, with ``--rank 1 --start-at T``, rank 1 starting at monotonic T."""
    if "--rank" in sys.argv:
        start_at = float(sys.argv[sys.argv.index("--start-at") + 1])
        time.sleep(max(0.0, start_at - time.monotonic()))
        run(1)
        return
    start_at = time.monotonic() + DELAY_S
    child = subprocess.Popen([sys.executable, __file__, "--rank", "1", "--start-at", str(start_at)])
    time.sleep(max(0.0, start_at - DELAY_S - time.monotonic()))
    run(0)
    if child.wait(timeout=60) != 0:
        raise SystemExit(f"rank 1 failed with exit status {child.returncode}")


if __name__ == "__main__":
    main()
