"""``study``'s sources beyond the phase table: tokens per joule, energy per sample, VeRL logs as a
run, records as a run (multi-turn, DAPO, lengths), and phases compared between the runs having
them. Every expected value is computed here from the raw inputs (JSON lines, the log's text, the
generator's ground-truth energy), not through the analysis."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
from nvtx_phases.analysis.errors import WorkloadInputError
from nvtx_phases.analysis.jobs.study import study_to
from nvtx_phases.analysis.workload.study import compared_phases, parse_study
from nvtxp_testkit import SAMPLES, shared_path

RULE = SAMPLES / "grpo_synthetic.sqlite"
RM = SAMPLES / "grpo_synthetic_rm.sqlite"
CPU = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"
LENGTHS = SAMPLES / "grpo_synthetic_lengths"
VERL = Path(__file__).parent / "data" / "verl_cpu_run"


def _study(tmp_path: Path, runs: list[str]) -> Path:
    file = tmp_path / "study.toml"
    file.write_text('title = "t"\n' + "".join(runs), encoding="utf-8")
    return file


def _run(label: str, axes: str = "", **inputs: str | Path) -> str:
    lines = [f'[[run]]\nlabel = "{label}"\n']
    lines += [f'{key} = "{value}"\n' for key, value in inputs.items()]
    return "".join(lines) + f"axes = {{ {axes} }}\n"


def _tidy(out: Path) -> dict[tuple[str, str, str, str], dict[str, str]]:
    with (out / "study.csv").open(newline="") as f:
        return {(r["run"], r["path"], r["attribution"], r["metric"]): r for r in csv.DictReader(f)}


def _lengths_by_step(folder: Path) -> dict[int, tuple[int, int]]:
    """Per step: (responses, response tokens) of the training rollouts, from the JSON lines."""
    steps: dict[int, tuple[int, int]] = {}
    for file in folder.glob("packed_lengths_step_*.jsonl"):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            if row.get("validate"):
                continue
            n, tokens = steps.get(row["step"], (0, 0))
            steps[row["step"]] = (n + len(row["output"]), tokens + sum(row["output"]))
    return steps


@pytest.fixture(scope="module")
def sample_study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    axes = 'hardware = "synthetic", n_gpus = 2'
    file = _study(
        tmp,
        [
            _run("rule", f'reward = "rule", {axes}', path=RULE),
            _run("model", f'reward = "model", {axes}', path=RM, lengths=LENGTHS),
            _run("cpu", 'reward = "rule"', path=CPU),
        ],
    )
    study_to(file, tmp / "out")
    return tmp / "out"


def test_joules_per_token_and_per_sample_against_ground_truth_and_raw_lengths(sample_study):
    tidy = _tidy(sample_study)
    truth = json.loads((SAMPLES / "grpo_synthetic.ground_truth.json").read_text())
    energy = {(p["step"], p["path"]): p["energy_j"] for p in truth["energy"]["driver_phases"]}
    lengths = _lengths_by_step(LENGTHS)
    gen = {s: j for (s, p), j in energy.items() if p == "step/gen"}
    expected = sum(gen.values()) / sum(lengths[s][1] for s in gen)  # gen: response tokens
    got = float(tidy[("rule", "step/gen", "window", "j_per_token")]["value"])
    # the counter path is within 0.06% of the model's energy per phase (README)
    assert got == pytest.approx(expected, rel=6e-4)
    per_sample = statistics.median(gen[s] / lengths[s][0] for s in gen)
    row = tidy[("rule", "step/gen", "window", "energy_per_sample_j")]
    assert float(row["value"]) == pytest.approx(per_sample, rel=6e-4)
    assert int(row["n_steps"]) == len(gen)
    samples = tidy[("rule", "step", "window", "samples_per_step")]
    assert float(samples["value"]) == statistics.median(n for n, _ in lengths.values())
    # the run given its lengths by the study file has them too; the CPU capture has no tokens
    assert ("model", "step/gen", "window", "j_per_token") in tidy
    assert not any(k[0] == "cpu" and k[3] == "j_per_token" for k in tidy)


def test_phases_are_compared_between_the_runs_having_them(sample_study):
    tidy = _tidy(sample_study)
    # the CPU capture has no projection rows: the GPU runs keep theirs (they share them)
    assert any(k[0] == "rule" and k[2] == "projection" for k in tidy)
    paths = {run: {(k[1], k[2]) for k in tidy if k[0] == run} for run in ("rule", "model", "cpu")}
    for run, mine in paths.items():
        others = set().union(*(v for r, v in paths.items() if r != run))
        assert mine <= others, (run, mine - others)  # no phase only one run has
    assert compared_phases({"a": {("x", "w"), ("y", "w")}, "b": {("x", "w")}}) == {("x", "w")}
    assert compared_phases({"a": {("x", "w")}}) == {("x", "w")}


def _log_timers(log: Path) -> dict[int, dict[str, float]]:
    """``timing_s/<stage>`` per step from the console log's text (a regex, not the parser)."""
    timers: dict[int, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        step = re.search(r"\bstep:(\d+) - ", line)
        if step is None:
            continue
        found = re.findall(r"timing_s/([A-Za-z_]+):([0-9.]+)", line)
        if found:
            timers.setdefault(int(step.group(1)), {}).update((k, float(v)) for k, v in found)
    return timers


def test_a_verl_log_alone_is_a_run_of_phase_timers(tmp_path):
    log = VERL / "verl_console.log"
    axes = 'hardware = "cpu"'
    file = _study(
        tmp_path,
        [_run("trace", axes, path=VERL / "verl_grpo.sqlite"), _run("log", axes, verl_log=log)],
    )
    study_to(file, tmp_path / "out")
    tidy = _tidy(tmp_path / "out")
    timers = _log_timers(log)
    assert len(timers) == 2
    gen = tidy[("log", "step/gen", "window", "wall_ms")]
    assert float(gen["value"]) == pytest.approx(
        statistics.median(t["gen"] * 1000 for t in timers.values()), rel=1e-12
    )
    assert gen["input"] == "verl_log" and gen["n_steps"] == "2"
    share = tidy[("log", "step/gen", "window", "time_share_pct")]
    expected = statistics.median(t["gen"] / t["step"] * 100 for t in timers.values())
    assert float(share["value"]) == pytest.approx(expected, rel=1e-12)
    # a log alone has no GPU figures at all (not 0) and is compared on the phases it shares
    assert ("log", "step/gen", "window", "gpu_busy_ms") not in tidy
    assert tidy[("trace", "step/gen", "window", "wall_ms")]["input"] == "trace"


def test_records_alone_are_a_run_of_workload_metrics(tmp_path):
    search = shared_path("polytrace/search_r1")
    dapo = shared_path("polytrace/dapo/20260614_023133")
    file = _study(
        tmp_path,
        [
            _run("rule", 'task = "math"', path=RULE),
            _run("search", 'task = "search"', lengths=search),
            _run("dapo", 'task = "dapo"', lengths=dapo),
        ],
    )
    study_to(file, tmp_path / "out")
    tidy = _tidy(tmp_path / "out")
    turns: dict[int, list[int]] = {}
    for path in search.glob("multiturn_workload_step_*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            turns.setdefault(row["step"], []).append(len(row["turns"]))
    row = tidy[("search", "step", "records", "turns_per_sample")]
    expected = statistics.median(statistics.fmean(v) for v in turns.values())
    assert float(row["value"]) == pytest.approx(expected, rel=1e-12)
    assert int(row["n_steps"]) == len(turns) and row["input"] == "records"
    batches: dict[int, list[dict]] = {}
    for line in (dapo / "dapo_filter_indices.jsonl").read_text().splitlines():
        record = json.loads(line)
        batches.setdefault(record["trainer_step"], []).append(record)
    filled = {
        s: b
        for s, b in batches.items()
        if sum(r["used_prompt_count"] for r in b) >= b[0]["train_batch_size"]
    }
    kept = statistics.median(
        sum(r["kept_prompt_count"] for r in b) / sum(r["prompt_count"] for r in b)
        for b in filled.values()
    )
    row = tidy[("dapo", "step", "records", "dapo_kept_fraction")]
    assert float(row["value"]) == pytest.approx(kept, rel=1e-12)
    assert int(row["n_steps"]) == len(filled)
    generations = statistics.median(len(b) for b in filled.values())
    assert float(tidy[("dapo", "step", "records", "dapo_generation_batches")]["value"]) == (
        generations
    )
    # the trace run is still compared; records runs have run metrics only
    assert not any(k[0] in ("search", "dapo") and k[2] != "records" for k in tidy)


def test_run_inputs_are_checked(tmp_path):
    with pytest.raises(WorkloadInputError, match="needs path, paths, verl_log or lengths"):
        parse_study(_study(tmp_path, ['[[run]]\nlabel = "a"\naxes = { task = "x" }\n']))
    with pytest.raises(WorkloadInputError, match="power needs the run's traces"):
        parse_study(
            _study(tmp_path, [_run("a", verl_log=VERL / "verl_console.log", power=LENGTHS)])
        )
    study = parse_study(
        _study(tmp_path, [_run("a", path=RULE, verl_log=VERL / "verl_console.log")])
    )
    assert study.runs[0].verl_logs == (VERL / "verl_console.log",)


def test_memory_per_phase_of_a_real_kineto_trace(tmp_path):
    """The peak device memory of a PyTorch-profiler trace's one step, by brute force over its JSON."""
    trace = shared_path("traces/kineto/brainstorm__brt_dr_3390402.1663735857573.pt.trace.json")
    file = _study(tmp_path, [_run("k", 'task = "x"', path=trace.resolve())])
    file.write_text(file.read_text().replace("axes =", "all_ranges = true\naxes ="))
    study_to(file, tmp_path / "out")
    tidy = _tidy(tmp_path / "out")
    events = json.loads(trace.read_text())["traceEvents"]
    (step,) = [e for e in events if e.get("ph") == "X" and e.get("name") == "ProfilerStep#3"]
    start, end = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    memory = [
        e
        for e in events
        if e.get("ph") == "i" and e.get("name") == "[memory]" and e["args"]["Device Type"] == 1
    ]
    peaks = []
    for device in {e["args"]["Device Id"] for e in memory}:
        mine = sorted(
            (e for e in memory if e["args"]["Device Id"] == device), key=lambda e: e["ts"]
        )
        before = [e for e in mine if float(e["ts"]) < start]
        entry = (
            int(before[-1]["args"]["Total Allocated"])
            if before
            else int(mine[0]["args"]["Total Allocated"]) - int(mine[0]["args"]["Bytes"])
        )
        inside = [int(e["args"]["Total Allocated"]) for e in mine if start <= float(e["ts"]) < end]
        peaks.append(max([entry, *inside]))
    row = tidy[("k", "ProfilerStep#3", "projection", "peak_memory_mb")]
    assert float(row["value"]) == pytest.approx(max(peaks) / 1e6, rel=1e-15)


def test_memory_metrics_against_the_generators_truth(tmp_path):
    """peak_memory_mb, h2d_mb, d2h_mb of ``synth --memory``: from its brute-force truth rows."""
    from nvtx_phases.analysis.cli import app
    from typer.testing import CliRunner

    trace = tmp_path / "m.sqlite"
    result = CliRunner().invoke(app, ["synth", str(trace), "--memory", "--steps", "3"])
    assert result.exit_code == 0, result.output
    file = _study(tmp_path, [_run("m", 'task = "x"', path=trace)])
    study_to(file, tmp_path / "out")
    tidy = _tidy(tmp_path / "out")
    truth = json.loads((tmp_path / "m.ground_truth.json").read_text())["memory"]["window"]
    paths = {r["path"] for r in truth}
    assert "step/gen" in paths
    for path in paths:
        rows = [r for r in truth if r["path"] == path]
        peak = tidy[("m", path, "window", "peak_memory_mb")]
        assert float(peak["value"]) == pytest.approx(
            max(r["peak_bytes"] for r in rows) / 1e6, rel=1e-15
        )
        per_step: dict[int, list[int]] = {}
        for r in rows:
            per_step.setdefault(r["step"], [0, 0])
            per_step[r["step"]][0] += r["h2d_bytes"]
            per_step[r["step"]][1] += r["d2h_bytes"]
        h2d = statistics.median(v[0] for v in per_step.values()) / 1e6
        d2h = statistics.median(v[1] for v in per_step.values()) / 1e6
        assert float(tidy[("m", path, "window", "h2d_mb")]["value"]) == pytest.approx(h2d)
        assert float(tidy[("m", path, "window", "d2h_mb")]["value"]) == pytest.approx(d2h)
        assert int(peak["n_steps"]) == len(per_step)
