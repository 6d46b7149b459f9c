"""Every number a user reads equals a brute-force computation of its definition.

On runs this project did not generate first (the real VeRL 0.9.1 GRPO run captured with nsys on
this CPU, the real nsys 2022.4 CPU capture, a real 2×H100 export), then on the generator's sample
with power and its Ray-style capture: the figure CSVs, the report's "What stands out", the
terminal table, the timeline JSON, ``whatif.csv`` and ``compare.csv`` are each checked against a
computation written here with the standard library over ``phases.csv`` (or plain SQL), never
against the tool's own code path. The definitions (README): share of a step = the phase's wall ÷
the ``step`` range's wall, median over steps; the per-step stack adds up to the step with an
``other (no phase)`` segment; the overlap bound is a pipeline with fill and drain; a compare
percentage only above the metric's floor.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest
from nvtxp_testkit import REPO, SAMPLES, shared_trace
from nvtxp_testkit import brute_quantile as quantile
from nvtxp_testkit import csv_rows as read_rows
from nvtxp_testkit import displayed as shown

VERL_RUN = REPO / "tests" / "data" / "verl_cpu_run" / "verl_grpo.sqlite"


def run_cli(*args: str) -> str:
    """``nvtx-phases ARGS`` in its own process (a wide terminal: one line per table header)."""
    env = {**os.environ, "COLUMNS": "400", "NVTX_PHASES_DRAW_WORKERS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_phases.analysis.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def number(text: str) -> float | None:
    return None if text in ("", "None") else float(text)


# --- the definitions, brute force over phases.csv -------------------------------------------------


def is_step_row(row: dict[str, str]) -> bool:
    """A ``step`` row, or a row directly inside ``step``, with a step index."""
    path = row["path"]
    return row["step"] != "" and (
        path == "step" or (path.startswith("step/") and path.count("/") == 1)
    )


def step_rows(phases: list[dict[str, str]]) -> tuple[dict, dict]:
    """Per step: (sum of ``step`` range walls, number of step ranges), and per (step, phase) the
    wall summed over the rows directly inside ``step``. A step with such a row cut at the
    capture's end (``cut_at_capture_end``: nsys closed the range there) has no true wall time
    and is left out."""
    cut = {
        row["step"] for row in phases if is_step_row(row) and row["cut_at_capture_end"] == "true"
    }
    steps: dict[int, list[float]] = {}
    inside: dict[tuple[int, str], float] = defaultdict(float)
    for row in phases:
        if row["step"] == "" or row["step"] in cut:
            continue
        step = int(row["step"])
        if row["path"] == "step":
            walls = steps.setdefault(step, [0.0, 0.0])
            walls[0] += float(row["wall_ns"])
            walls[1] += float(row["n_ranges"])
        elif row["path"].startswith("step/") and row["path"].count("/") == 1:
            inside[(step, row["canonical"])] += float(row["wall_ns"])
    return steps, inside


def time_shares(phases: list[dict[str, str]]) -> dict[str, list[float]]:
    """Per phase, its share of each step (%) over the steps where it ran."""
    steps, inside = step_rows(phases)
    shares: dict[str, list[float]] = defaultdict(list)
    for (step, name), wall in sorted(inside.items()):
        if step in steps and steps[step][0] > 0:
            shares[name].append(100 * wall / steps[step][0])
    return shares


# --- the runs ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each case analyzed, reported, drawn on a timeline, and (with steps) bounded by whatif."""
    root = tmp_path_factory.mktemp("consistency")
    ray = root / "ray_traces"
    run_cli("synth", str(ray), "--ray")
    cases = {
        "verl_cpu_run": ([str(VERL_RUN)], True),
        "cpu_rl_step_nsys2022.4": ([str(SAMPLES / "cpu_rl_step_nsys2022.4.sqlite")], True),
        "h100_all_ranges": (
            [str(shared_trace("nsysai_h100_2gpu_1s.sqlite")), "--all-ranges"],
            False,
        ),
        "sample_power": ([str(SAMPLES / "grpo_synthetic.sqlite")], True),
        "ray": ([str(ray)], True),
    }
    found = {}
    for name, (inputs, has_steps) in cases.items():
        out = root / name
        terminal = run_cli("analyze", *inputs, "--out", str(out), "--max-rows", "100000")
        run_cli("report", str(out), "--out", str(out))
        run_cli("timeline", str(out), "--out", str(out / "timeline.json.gz"))
        if has_steps:
            run_cli("whatif", str(out), "--out", str(out / "whatif"))
        found[name] = {"out": out, "terminal": terminal, "has_steps": has_steps}
    return found


CASES = ["verl_cpu_run", "cpu_rl_step_nsys2022.4", "h100_all_ranges", "sample_power", "ray"]
STEPPED = [c for c in CASES if c != "h100_all_ranges"]


@pytest.mark.parametrize("case", STEPPED)
def test_phase_share_figure_is_the_median_share_of_the_step(runs, case):
    out = runs[case]["out"]
    shares = time_shares(read_rows(out / "phases.csv"))
    drawn = {row["phase"]: row for row in read_rows(out / "figures" / "phase_share.csv")}
    assert set(drawn) == set(shares)
    for name, values in shares.items():
        row = drawn[name]
        assert int(row["n_steps"]) == len(values)
        for q, column in ((0.1, "p10"), (0.5, "median"), (0.9, "p90")):
            assert number(row[f"time_share_{column}_pct"]) == pytest.approx(
                quantile(values, q), rel=1e-12
            )


@pytest.mark.parametrize("case", STEPPED)
def test_phase_time_per_step_adds_up_to_each_step(runs, case):
    out = runs[case]["out"]
    steps, inside = step_rows(read_rows(out / "phases.csv"))
    drawn = read_rows(out / "figures" / "phase_time_per_step.csv")
    per_bar: dict[int, dict[str, float]] = defaultdict(dict)
    for row in drawn:
        assert row["first_step"] == row["last_step"]  # fewer than 40 steps: one bar per step
        per_bar[int(row["first_step"])][row["phase"]] = float(row["wall_ms"])
    for step, (step_ns, n) in steps.items():
        phases = {name: wall / n / 1e6 for (s, name), wall in inside.items() if s == step}
        expected = dict(phases)
        other = step_ns / n / 1e6 - sum(phases.values())
        if other > 0:
            expected["other (no phase)"] = other
        assert per_bar[step].keys() == expected.keys()
        for name, wall_ms in expected.items():
            assert per_bar[step][name] == pytest.approx(wall_ms, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("case", STEPPED)
def test_busy_idle_and_data_movement_figures_sum_the_phase_rows(runs, case):
    out = runs[case]["out"]
    if not (out / "figures" / "busy_idle_per_phase.csv").exists():
        # a CPU-only capture: no GPU figure, and phases.csv holds no GPU time to draw
        assert all(int(r["gpu_busy_ns"]) == 0 for r in read_rows(out / "phases.csv"))
        return
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in read_rows(out / "phases.csv"):
        if row["step"] and row["path"].startswith("step/") and row["path"].count("/") == 1:
            for column in ("gpu_busy_ns", "idle_ns", "nccl_ns", "memcpy_ns", "memcpy_bytes"):
                sums[row["canonical"]][column] += int(row[column])
    for row in read_rows(out / "figures" / "busy_idle_per_phase.csv"):
        assert int(row["gpu_busy_ns"]) == sums[row["phase"]]["gpu_busy_ns"]
        assert int(row["gpu_idle_ns"]) == sums[row["phase"]]["idle_ns"]
    for row in read_rows(out / "figures" / "data_movement_per_phase.csv"):
        for column in ("nccl_ns", "memcpy_ns", "memcpy_bytes"):
            assert int(row[column]) == sums[row["phase"]][column]


def test_energy_per_device_sums_to_the_phase_energy(runs):
    out = runs["sample_power"]["out"]
    per_phase: dict[str, float] = defaultdict(float)
    for row in read_rows(out / "phases.csv"):
        if row["step"] and row["path"].startswith("step/") and row["path"].count("/") == 1:
            per_phase[row["path"]] += float(row["energy_j"])
    drawn: dict[str, float] = defaultdict(float)
    for row in read_rows(out / "figures" / "energy_per_phase_device.csv"):
        drawn[row["path"]] += float(row["energy_j"])
    assert drawn.keys() == per_phase.keys()
    for path, energy in per_phase.items():
        assert drawn[path] == pytest.approx(energy, rel=1e-9)


@pytest.mark.parametrize("case", STEPPED)
def test_report_states_the_same_share_as_the_figure(runs, case):
    out = runs[case]["out"]
    text = (out / "report.md").read_text(encoding="utf-8")
    found = re.search(
        r"- step/(\S+) takes the most time: .*?, ([\d.]+)% of the step "
        r"\(p10–p90 ([\d.]+)–([\d.]+)%\); median over steps",
        text,
    )
    assert found, text[:2000]
    name = found[1]
    values = time_shares(read_rows(out / "phases.csv"))[name]
    assert float(found[2]) == round(quantile(values, 0.5), 1)
    assert float(found[3]) == round(quantile(values, 0.1), 1)
    assert float(found[4]) == round(quantile(values, 0.9), 1)
    # the largest phase is the one with the largest median wall time (brute force)
    _, inside = step_rows(read_rows(out / "phases.csv"))
    walls: dict[str, list[float]] = defaultdict(list)
    for (_, phase), wall in inside.items():
        walls[phase].append(wall)
    assert name == max(walls, key=lambda p: quantile(walls[p], 0.5))


def terminal_rows(text: str) -> list[dict[str, str]]:
    """The rows of every phase table the CLI printed, keyed by their header cells."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    group = ""
    for line in text.splitlines():
        if line.startswith("┃"):
            header = [cell.strip() for cell in line.strip("┃").split("┃")]
        elif line.startswith("│") and header is not None:
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            if re.match(r"(driver|worker|process) · ", cells[1]):
                group = cells[1]  # "driver · pid 1000" / "worker · pid 2000"
                continue
            rows.append({"group": group, **dict(zip(header, cells, strict=True))})
    return rows


def ms(ns: str) -> str:
    return shown(int(ns) / 1e6, 2)


@pytest.mark.parametrize("case", CASES)
def test_terminal_table_shows_the_phase_rows(runs, case):
    out = runs[case]["out"]
    printed = terminal_rows(runs[case]["terminal"])
    assert printed, runs[case]["terminal"][:3000]
    phases = read_rows(out / "phases.csv")
    # a name can repeat under other parents in one step (VeRL's infer_batch under
    # compute_log_prob and compute_ref_log_prob): the printed row is one of those candidates
    by_key: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for row in phases:
        by_key[(row["pid"], row["step"], row["phase"], row["attribution"])].append(row)
    checked = 0
    for cells in printed:
        pid = re.search(r"pid (\d+)", cells["group"])[1]
        scheme = "window" if cells["group"].startswith(("driver", "process")) else "projection"
        key = (pid, cells["step"], cells["phase"].strip(), scheme)
        if key not in by_key or cells["phase"].endswith("…"):
            continue
        candidates = [r for r in by_key[key] if ms(r["wall_ns"]) == cells["wall ms"]]
        assert candidates, (cells, by_key[key])
        row = candidates[0]
        if "kernel ms" in cells and cells["kernel ms"] != "—":
            assert cells["kernel ms"] == ms(row["kernel_ns"])
            assert cells["kernels"] == f"{int(row['n_kernels']):,}"
        if "graph ms" in cells and cells["graph ms"] != "—":
            assert cells["graph ms"] == ms(row["graph_ns"])
        if scheme == "window" and cells.get("GPU busy %", "—") != "—":
            busy = 100 * int(row["gpu_busy_ns"]) / (int(row["wall_ns"]) * int(row["n_devices"]))
            assert cells["GPU busy %"] == shown(busy, 0, pct=True)
            assert cells["GPU idle ms"] == ms(row["idle_ns"])
        if scheme == "projection" and cells.get("process GPU busy %", "—") not in ("—", ""):
            devices = int(row["process_n_devices"])
            busy = 100 * int(row["process_gpu_busy_ns"]) / (int(row["wall_ns"]) * devices)
            assert cells["process GPU busy %"] == shown(busy, 0, pct=True)
            assert cells["process GPU idle ms"] == ms(row["process_idle_ns"])
        checked += 1
    assert checked >= min(10, len(printed))


@pytest.mark.parametrize("case", CASES)
def test_timeline_slices_are_the_ranges_with_their_phase_rows(runs, case):
    out = runs[case]["out"]
    with gzip.open(out / "timeline.json.gz", "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X" and "this range" in e.get("args", {})]
    # a traced process's track is named "<file> pid <pid>"
    process = {
        e["pid"]: e["args"]["name"].rsplit(" pid ", 1)
        for e in events
        if e.get("ph") == "M" and e["name"] == "process_name" and " pid " in e["args"]["name"]
    }
    # and a thread's "thread <tid>" (its track id may differ from the tid: several tracks)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    phases = {
        (r["trace"], r["pid"], r["step"], r["path"], r["attribution"]): r
        for r in read_rows(out / "phases.csv")
    }
    n_ranges = sum(int(r["n_ranges"]) for r in phases.values())
    assert len(slices) == n_ranges
    for event in slices[:2000]:
        own = event["args"]["this range"]
        assert round(event["dur"] * 1000) == own["end_ns"] - own["start_ns"]
        assert round(event["ts"] * 1000) == own["start_ns"]
        table = event["args"]["phase-table row (totals over all its ranges)"]
        trace, pid = process[event["pid"]]
        assert threads[(event["pid"], event["tid"])].startswith(f"thread {own['tid']}")
        row = phases[
            (
                trace,
                pid,
                "" if own.get("step") is None else str(own["step"]),
                own["path"],
                own["attribution"],
            )
        ]
        assert table["wall_ns"] == int(row["wall_ns"])
        assert table["n_ranges"] == int(row["n_ranges"])
        assert table.get("kernel_ns", 0) == int(row["kernel_ns"])


@pytest.mark.parametrize("case", STEPPED)
def test_whatif_overlap_is_the_pipeline_with_fill_and_drain(runs, case):
    out = runs[case]["out"]
    steps, inside = step_rows(read_rows(out / "phases.csv"))
    order = sorted(s for s in steps if (s, "gen") in inside)
    rows = [
        r
        for r in read_rows(out / "whatif" / "whatif.csv")
        if r["bound"] == "overlap_gen_train" and r["variant"] == "separate_gpus"
    ]
    if not order:
        assert all(r["bound_s"] == "" for r in rows)
        return
    # driver phases: one process marks step and gen (the VeRL trainer)
    gen = [inside[(s, "gen")] / 1e9 for s in order]
    rest = [steps[s][0] / 1e9 - g for s, g in zip(order, gen, strict=True)]
    run = gen[0] + sum(max(gen[k + 1], rest[k]) for k in range(len(order) - 1)) + rest[-1]
    bounds = {int(r["step"]): float(r["bound_s"]) for r in rows}
    assert sorted(bounds) == order
    assert sum(bounds.values()) == pytest.approx(run, rel=1e-12)
    measured = sum(steps[s][0] for s in order) / 1e9
    assert sum(float(r["measured_s"]) for r in rows) == pytest.approx(measured, rel=1e-12)


def test_compare_percentages_only_above_the_floor(tmp_path):
    a, b = SAMPLES / "grpo_synthetic.sqlite", SAMPLES / "grpo_synthetic_rm.sqlite"
    out = tmp_path / "cmp"
    run_cli("compare", str(a), str(b), "-l", "a", "-l", "b", "--out", str(out))
    run_cli("analyze", str(a), "--out", str(tmp_path / "a"), "--no-figures")
    run_cli("analyze", str(b), "--out", str(tmp_path / "b"), "--no-figures")
    medians: dict[tuple[str, str], float] = {}
    for label in ("a", "b"):
        per_step: dict[tuple[str, int], float] = defaultdict(float)
        for row in read_rows(tmp_path / label / "phases.csv"):
            if row["step"] and row["attribution"] == "window":
                key = (row["path"], int(row["step"]))
                per_step[key] = max(per_step[key], int(row["wall_ns"]) / 1e6)
        for path in {p for p, _ in per_step}:
            values = [v for (p, _), v in per_step.items() if p == path]
            medians[(label, path)] = quantile(values, 0.5)
    table = read_rows(out / "compare.csv")
    checked = 0
    for row in table:
        if row["metric"] != "wall_ms" or row["attribution"] != "window" or row["run"] != "b":
            continue
        base, other = medians[("a", row["path"])], medians[("b", row["path"])]
        assert float(row["median"]) == pytest.approx(other, rel=1e-12)
        assert float(row["diff"]) == pytest.approx(other - base, rel=1e-9, abs=1e-12)
        if base >= 1e-3:  # 1 µs, in ms
            assert float(row["diff_pct"]) == pytest.approx((other - base) / base * 100, rel=1e-9)
        else:
            assert row["diff_pct"] == ""
        checked += 1
    assert checked >= 8
    # energies below 1 mJ: no percentage, and never a negative zero printed
    for row in table:
        floor = number(row["pct_floor"])
        base = next(
            (
                r
                for r in table
                if r["path"] == row["path"]
                and r["metric"] == row["metric"]
                and r["attribution"] == row["attribution"]
                and r["run"] == "a"
            ),
            None,
        )  # a phase only the second run has (the reward model's) has no base
        base_median = None if base is None else number(base["median"])
        if floor is not None and base_median is not None and abs(base_median) < floor:
            assert row["diff_pct"] == ""
    markdown = (out / "compare.md").read_text(encoding="utf-8")
    assert "-0.000" not in markdown and "+0.0%" not in markdown
