"""The overlap what-if against a brute-force schedule, computed here from raw inputs.

One-step-off async RL is simulated event by event, not by the module's formula: step k's
generation starts when step k−1's generation is done and step k−2's update is in (its weights);
step k's rest (everything after its gen) starts when its batch is generated and step k−1's rest
is done. The run ends when the last rest does. The per-step times come from the raw inputs: the
sample trace's NVTX ranges read with plain SQL, and VeRL logs parsed here with a regex or json.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "verl_logs"


def schedule(gens: list[float], rests: list[float]) -> tuple[list[float], list[float]]:
    """When each step's gen and rest end, event by event (times from 0)."""
    gen_end: list[float] = []
    rest_end: list[float] = []
    for k, (gen, rest) in enumerate(zip(gens, rests, strict=True)):
        start = max(gen_end[k - 1] if k >= 1 else 0.0, rest_end[k - 2] if k >= 2 else 0.0)
        gen_end.append(start + gen)
        start = max(gen_end[k], rest_end[k - 1] if k >= 1 else 0.0)
        rest_end.append(start + rest)
    return gen_end, rest_end


def _check(table: pl.DataFrame, steps: list[int], gens: list[float], walls: list[float]) -> None:
    """``whatif.csv``'s separate-GPU overlap rows against :func:`schedule`.

    The rows add up, step by step, to when the pipeline is done with that step: its rest ended
    and the next step's gen too (they ran side by side); the last row ends the run.
    """
    rows = table.filter(
        (pl.col("bound") == "overlap_gen_train") & (pl.col("variant") == "separate_gpus")
    ).sort("step")
    assert rows["step"].to_list() == steps
    gen_end, rest_end = schedule(gens, [w - g for w, g in zip(walls, gens, strict=True)])
    done = [max(rest_end[k], gen_end[k + 1]) for k in range(len(steps) - 1)] + [rest_end[-1]]
    assert rows["bound_s"].cum_sum().to_list() == pytest.approx(done, abs=1e-6)
    assert rows["measured_s"].to_list() == pytest.approx(walls, abs=1e-9)
    assert rows["saving_s"].sum() == pytest.approx(sum(walls) - rest_end[-1], abs=1e-6)


def _whatif(tmp_path: Path, *args: str) -> pl.DataFrame:
    done = runner.invoke(app, ["whatif", *args, "--out", str(tmp_path / "w"), "--no-figures"])
    assert done.exit_code == 0, done.output
    return pl.read_csv(tmp_path / "w" / "whatif.csv")


def test_sample_trace_against_its_nvtx_ranges(tmp_path):
    trace = SAMPLES / "grpo_synthetic.sqlite"
    sql = """
        SELECT s.int64Value, s."end" - s.start, g."end" - g.start
        FROM NVTX_EVENTS s JOIN NVTX_EVENTS g
          ON g.globalTid = s.globalTid AND g.start >= s.start AND g."end" <= s."end"
        LEFT JOIN StringIds sn ON sn.id = s.textId
        LEFT JOIN StringIds gn ON gn.id = g.textId
        WHERE coalesce(s.text, sn.value) = 'step' AND coalesce(g.text, gn.value) = 'gen'
        ORDER BY s.int64Value
    """
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        rows = db.execute(sql).fetchall()
    assert [r[0] for r in rows] == [1, 2, 3]
    table = _whatif(tmp_path, str(trace))
    _check(table, [1, 2, 3], [r[2] / 1e9 for r in rows], [r[1] / 1e9 for r in rows])


def _console_timers(path: Path, prefix: str = "timing_s/") -> dict[int, dict[str, float]]:
    """``{step: {stage: seconds}}`` from console lines, with a regex of this test's own."""
    found: dict[int, dict[str, float]] = {}
    key = re.compile(re.escape(prefix) + r"(\w+):(?:np\.float64\()?([-\d.e+]+)")
    for line in path.read_text(errors="replace").splitlines():
        match = re.search(r"step:(\d+) - ", line)
        timers = dict(key.findall(line)) if match else {}
        if timers:
            found[int(match[1])] = {k: float(v) for k, v in timers.items()}
    return found


@pytest.mark.parametrize("source", ["console", "jsonl"])
def test_verl_logs_against_their_timers(tmp_path, source):
    if source == "console":
        path = DATA / "console_grpo.log"
        timers = _console_timers(path)
    else:
        path = DATA / "file_logger_ppo.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        timers = {
            r["step"]: {k[9:]: v for k, v in r["data"].items() if k.startswith("timing_s/")}
            for r in records
            if "timing_s/step" in r["data"]
        }
    assert runner.invoke(app, ["logs", str(path), "--out", str(tmp_path / "logs")]).exit_code == 0
    table = _whatif(tmp_path, str(tmp_path / "logs"))
    steps = sorted(timers)
    _check(
        table,
        steps,
        [timers[s]["gen"] for s in steps],
        [timers[s]["step"] for s in steps],
    )


def test_a_verl_01_log_without_step_timers(tmp_path):
    # VeRL 0.1's console format (f"{k}:{v:.3f}", timing/<stage>, no step timer): 30 steps,
    # the first holding a long warm-up; a step's time is then the sum of its stage timers
    rng = random.Random(7)
    stages = ("gen", "ref", "values", "adv", "update_critic", "update_actor")
    lines, gens, walls = [], [], []
    for step in range(30):
        timers = {s: round(rng.uniform(0.1, 30.0), 3) for s in stages}
        timers["gen"] += 100.0 if step == 0 else 0.0
        body = " - ".join(f"timing/{k}:{v:.3f}" for k, v in timers.items())
        lines.append(f"(main_task pid=1) step:{step} - {body} - critic/vf_loss:1.250")
        gens.append(timers["gen"])
        walls.append(sum(timers.values()))
    log = tmp_path / "v01.log"
    log.write_text("\n".join(lines) + "\n")
    assert runner.invoke(app, ["logs", str(log), "--out", str(tmp_path / "logs")]).exit_code == 0
    table = _whatif(tmp_path, str(tmp_path / "logs"))
    _check(table, list(range(30)), gens, walls)
    # and without the warm-up step: the pipeline fills with step 1's gen
    rest = _whatif(tmp_path / "s", str(tmp_path / "logs"), "--steps", "1:")
    _check(rest, list(range(1, 30)), gens[1:], walls[1:])
