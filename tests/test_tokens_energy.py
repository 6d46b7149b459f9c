"""Tokens and energy per phase (``tokens_energy.csv``): each number against one computed here.

Expected values come from the raw inputs with the standard library: token counts from the
VeRL console log's text (and, as a second check, from VeRL's own ``timing_per_token_ms/gen``)
and from the length records' JSON lines; energy and wall time from the generator's ground
truth of the bundled sample. Never from the code under test.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis import analyze, load_analysis, write_outputs
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import InputError, WorkloadInputError
from nvtx_phases.analysis.workload.token_energy import TOKENS_ENERGY_SCHEMA, tokens_energy
from nvtx_phases.analysis.workload.tokens import (
    read_step_tokens,
    step_tokens_from_verl,
    with_step_tokens,
)
from nvtx_phases.analysis.workload.verl_logs import LOG_SCHEMA
from nvtxp_testkit import SAMPLES, csv_rows
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data"
CPU_RUN = DATA / "verl_cpu_run"
ASYNC_RUN = DATA / "verl_async_run"
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
SAMPLE_LENGTHS = SAMPLES / "grpo_synthetic_lengths"
TRUTH = SAMPLES / "grpo_synthetic.ground_truth.json"
INFERENCE = {"gen", "gen_max", "reward", "old_log_prob", "ref", "values"}
TRAINING = {"update_actor", "update_critic"}


# --- the independent side ------------------------------------------------------------------------


def _log_metrics(path: Path) -> dict[int, dict[str, float]]:
    """Per step, every ``key:number`` of VeRL's console lines (the last line of a step wins)."""
    steps: dict[int, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        found = re.search(r"step:(\d+) - (.*)$", line)
        if not found:
            continue
        metrics = {}
        for item in found.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            value = re.sub(r"^np\.\w+\((.*)\)$", r"\1", value.strip())
            with contextlib.suppress(ValueError):
                metrics[key] = float(value)
        if "perf/total_num_tokens" in metrics:
            steps[int(found.group(1))] = metrics
    return steps


def _expected_from_log(path: Path) -> dict[int, tuple[int, int]]:
    """Per step (response tokens, prompt + response tokens): N = total / (p̄ + r̄), N × r̄."""
    out = {}
    for step, m in _log_metrics(path).items():
        total = m["perf/total_num_tokens"]
        n = total / (m["prompt_length/mean"] + m["response_length/mean"])
        assert abs(n - round(n)) < 1e-9, (step, n)
        out[step] = (round(round(n) * m["response_length/mean"]), round(total))
    return out


def _expected_from_lengths(folder: Path) -> dict[int, tuple[int, int]]:
    """Per step (Σ responses, Σ prompt + responses): each response carries its prompt."""
    out: dict[int, list[int]] = {}
    for file in folder.glob("packed_lengths_step_*.jsonl"):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            if row.get("validate"):
                continue
            sums = out.setdefault(row["step"], [0, 0])
            sums[0] += sum(row["output"])
            sums[1] += sum(row["output"]) + row["input"] * len(row["output"])
    return {step: (r, t) for step, (r, t) in out.items()}


def _rows(frame: pl.DataFrame, **match: object) -> list[dict]:
    return [r for r in frame.iter_rows(named=True) if all(r[k] == v for k, v in match.items())]


def _one(frame: pl.DataFrame, **match: object) -> dict:
    rows = _rows(frame, **match)
    assert len(rows) == 1, (match, rows)
    return rows[0]


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel)


# --- the real VeRL CPU run: token counts from its own log, no power --------------------------------


def test_the_real_verl_run_counts_tokens_from_its_log_and_says_there_is_no_power(tmp_path):
    log = CPU_RUN / "verl_console.log"
    expected = _expected_from_log(log)
    assert expected == {1: (256, 496), 2: (231, 471)}
    # VeRL's own per-token timer divides gen's time by the response tokens: the same count
    metrics = _log_metrics(log)
    for step, (response, _) in expected.items():
        m = metrics[step]
        by_timer = m["timing_s/gen"] * 1000 / m["timing_per_token_ms/gen"]
        assert abs(by_timer - response) < 1e-6

    out = tmp_path / "out"
    args = ["analyze", str(CPU_RUN / "verl_grpo.sqlite"), "--verl-log", str(log), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--no-figures", "-q"])
    assert result.exit_code == 0, result.output
    rows = csv_rows(out / "tokens_energy.csv")
    tokens = csv_rows(out / "step_tokens.csv")
    assert [
        (int(r["step"]), int(r["response_tokens"]), int(r["total_tokens"])) for r in tokens
    ] == [(s, *expected[s]) for s in sorted(expected)]
    for row in rows:
        if not row["step"]:
            continue
        response, total = expected[int(row["step"])]
        if row["scope"] == "kind":
            assert row["tokens"] == ""
            continue
        want = response if row["phase"] == "gen" else total
        assert int(row["tokens"]) == want, row
        assert row["token_rule"] == ("response" if row["phase"] == "gen" else "prompt+response")
        assert row["token_source"] == "verl_log"
        # no power: every energy number is empty, never 0, and the note says why
        for column in ("energy_j", "j_per_token", "tokens_per_j", "mean_power_w"):
            assert row[column] == "", (column, row)
        assert row["note"].startswith("no power samples")
    gen_all = [r for r in rows if not r["step"] and r["phase"] == "gen"]
    assert int(gen_all[0]["tokens"]) == 256 + 231 and gen_all[0]["n_steps"] == "2"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["options"]["token_sources"] == {"verl_log": [str(log.absolute())]}
    assert [i["kind"] for i in summary["provenance"]["inputs"]].count("verl_log") == 1


def test_the_real_fully_async_run_gives_no_generation_energy_to_the_trainers_gen():
    tokens = read_step_tokens(verl_logs=[ASYNC_RUN / "verl_console.log"])
    assert tokens is not None
    # the log's step 3 is logged twice: the last record wins (as for every VeRL metric)
    assert {r["step"]: r["total_tokens"] for r in tokens.frame.iter_rows(named=True)} == {
        1: 243,
        2: 496,
        3: 248,
    }
    assert tokens.warnings == (
        "the VeRL log records the token counts of step(s) 3 more than once: the last "
        "record's are used",
    )
    with analyze([ASYNC_RUN / "verl_async.sqlite"]) as run:
        table = tokens_energy(with_step_tokens(run, tokens))
        assert table is not None
        gen = _rows(table, scope="phase", phase="gen")
        assert gen and all(r["kind"] is None for r in gen)  # a queue wait, not inference
        assert _one(table, step=1, phase="gen")["tokens"] == 123  # 4 × 30.75
        assert "no token count" in _one(table, step=4, phase="gen")["note"]
        warned = with_step_tokens(run, tokens).warnings
        assert any(
            "step(s) 0, 4:7 have no token counts (counts for steps 1:3)" in w for w in warned
        )


# --- the bundled sample: power, length records and the generator's ground truth ------------------


@pytest.fixture(scope="module")
def sample_table():
    tokens = read_step_tokens(lengths=SAMPLE_LENGTHS)
    with analyze([SAMPLE]) as run:
        run = with_step_tokens(run, tokens)
        yield run, tokens_energy(run)


def test_sample_joules_per_token_against_ground_truth_energy_and_raw_lengths(sample_table):
    _, table = sample_table
    truth = json.loads(TRUTH.read_text())
    energy = {(p["step"], p["path"]): p["energy_j"] for p in truth["energy"]["driver_phases"]}
    wall = {(p["step"], p["path"]): p["wall_ns"] for p in truth["driver_phases"]}
    counts = _expected_from_lengths(SAMPLE_LENGTHS)
    assert counts == {1: (42360, 76008), 2: (44804, 77372), 3: (43494, 76302)}
    checked = 0
    for (step, path), joules in energy.items():
        phase = path.rpartition("/")[2]
        row = _one(table, step=step, phase=phase, scope="step" if path == "step" else "phase")
        tokens = counts[step][0] if phase == "gen" else counts[step][1]
        assert row["tokens"] == tokens
        # the counter path is within 0.06% of the model's energy per phase (README)
        assert _close(row["energy_j"], joules, 6e-4), (path, row["energy_j"], joules)
        assert _close(row["j_per_token"], joules / tokens, 6e-4)
        assert _close(row["tokens_per_j"], tokens / joules, 6e-4)
        assert _close(row["mean_power_w"], joules / (wall[(step, path)] / 1e9), 6e-4)
        assert row["note"] is None
        checked += 1
    assert checked == 24
    # over all steps: Σ energy / Σ tokens, written out
    for phase in ("gen", "update_actor"):
        joules = sum(v for (s, p), v in energy.items() if p == f"step/{phase}")
        tokens = sum(c[0] if phase == "gen" else c[1] for c in counts.values())
        row = _one(table.filter(pl.col("step").is_null()), phase=phase, scope="phase")
        assert row["n_steps"] == 3 and row["tokens"] == tokens
        assert _close(row["j_per_token"], joules / tokens, 6e-4)


def test_sample_inference_over_training_power_against_ground_truth(sample_table):
    _, table = sample_table
    truth = json.loads(TRUTH.read_text())
    energy = {(p["step"], p["path"]): p["energy_j"] for p in truth["energy"]["driver_phases"]}
    wall = {(p["step"], p["path"]): p["wall_ns"] for p in truth["driver_phases"]}

    def power(steps: set[int], kinds: set[str]) -> float:
        keys = [(s, p) for (s, p) in energy if s in steps and p.rpartition("/")[2] in kinds]
        keys = [k for k in keys if k[1] != "step"]
        return sum(energy[k] for k in keys) / sum(wall[k] / 1e9 for k in keys)

    for step in (1, 2, 3):
        inference, training = power({step}, INFERENCE), power({step}, TRAINING)
        assert _close(_one(table, step=step, phase="inference")["mean_power_w"], inference, 6e-4)
        assert _close(_one(table, step=step, phase="training")["mean_power_w"], training, 6e-4)
        ratio = _one(table, step=step, scope="step")["inference_over_training"]
        assert _close(ratio, inference / training, 1e-3)
    overall = table.filter(pl.col("step").is_null())
    inference, training = power({1, 2, 3}, INFERENCE), power({1, 2, 3}, TRAINING)
    assert _close(_one(overall, phase="inference")["mean_power_w"], inference, 6e-4)
    assert _close(
        _one(overall, scope="step")["inference_over_training"], inference / training, 1e-3
    )
    # phases of neither kind (adv, update_weights) are in no kind row
    assert _one(table, step=1, phase="adv")["kind"] is None


def test_the_energy_is_the_phase_tables_energy(sample_table):
    run, table = sample_table
    window = run.phases.filter(pl.col("attribution") == "window")
    for row in _rows(table, scope="phase") + _rows(table, scope="step"):
        if row["step"] is None:
            continue
        path = "step" if row["scope"] == "step" else f"step/{row['phase']}"
        phase = window.filter((pl.col("step") == row["step"]) & (pl.col("path") == path))
        assert phase["energy_j"].to_list() == [row["energy_j"]]


def test_outputs_round_trip_select_steps_and_report(tmp_path, sample_table):
    run, table = sample_table
    out = tmp_path / "out"
    write_outputs(run, out)
    assert pl.read_csv(out / "tokens_energy.csv", schema=TOKENS_ENERGY_SCHEMA).equals(table)
    back = load_analysis(out)
    assert back.step_tokens is not None and back.step_tokens.equals(run.step_tokens)
    from nvtx_phases.analysis.run.select import select_steps

    chosen = tokens_energy(select_steps(run, "2"))
    assert chosen is not None
    assert set(chosen["step"].drop_nulls()) == {2}
    # over the selected step only: the overall gen row is step 2's
    assert _one(chosen.filter(pl.col("step").is_null()), phase="gen")["tokens"] == 44804

    report = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(report)])
    assert result.exit_code == 0, result.output
    page = (report / "report.md").read_text()
    assert "Tokens and energy per phase (all steps)" in page
    assert "inference vs training power per step" in page
    # the report shows the table's number, in mJ/token: gen over all steps
    gen = _one(table.filter(pl.col("step").is_null()), phase="gen")
    assert f"{gen['j_per_token'] * 1000:.3f} mJ/token" in page


# --- no tokens, logs that cannot give response tokens, bad input ---------------------------------


def test_without_tokens_there_is_no_table_and_the_outputs_are_as_before(tmp_path):
    with analyze([SAMPLE]) as run:
        assert run.step_tokens is None and tokens_energy(run) is None
        written = {p.name for p in write_outputs(run, tmp_path / "out")}
    assert "tokens_energy.csv" not in written and "step_tokens.csv" not in written
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "token_sources" not in summary["provenance"]["options"]
    assert read_step_tokens() is None


def test_means_not_over_the_totals_sequences_give_no_response_tokens():
    # this log's totals are not (p̄ + r̄) × a whole number of sequences: 183296 / 716.75 = 255.7
    tokens = read_step_tokens(verl_logs=[DATA / "verl_logs" / "console_grpo.log"])
    assert tokens is not None
    frame = tokens.frame
    assert frame["response_tokens"].null_count() == 3
    assert frame["total_tokens"].to_list() == [183296, 190464, 178688]
    assert "255.732 sequences, not a whole number" in frame["note"][0]
    with analyze([SAMPLE]) as run:  # steps 1–3, with power
        table = tokens_energy(with_step_tokens(run, tokens))
    assert table is not None
    gen = _one(table, step=1, phase="gen")
    assert gen["tokens"] is None and gen["j_per_token"] is None and gen["energy_j"] > 0
    assert "not a whole number" in gen["note"]
    ref = _one(table, step=1, phase="ref")
    assert ref["tokens"] == 183296 and _close(ref["j_per_token"], ref["energy_j"] / 183296, 1e-12)
    # a file-logger log without prompt_length/mean: totals only
    ppo = read_step_tokens(verl_logs=[DATA / "verl_logs" / "file_logger_ppo.jsonl"])
    assert ppo is not None and ppo.frame["response_tokens"].null_count() == ppo.frame.height
    assert "no prompt_length/mean" in ppo.frame["note"][0]


def _values(rows: list[tuple[int, str, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(0, i, s, k, i, v) for i, (s, k, v) in enumerate(rows)], schema=LOG_SCHEMA, orient="row"
    )


def test_derivation_is_exact_below_float32s_limit_and_bounded_above():
    small = step_tokens_from_verl(
        _values(
            [
                (1, "perf/total_num_tokens", 1000.0),
                (1, "prompt_length/mean", 50.0),
                (1, "response_length/mean", 75.0),
            ]
        )
    )
    assert small.row(0, named=True) | {"note": None} == {
        "step": 1,
        "prompt_tokens": 400,
        "response_tokens": 600,
        "total_tokens": 1000,
        "n_sequences": 8,
        "source": "verl_log",
        "note": None,
    }
    # 1024 sequences × 9000.5 response tokens: 9.2 M, past what float32 means pin down
    big = step_tokens_from_verl(
        _values(
            [
                (2, "perf/total_num_tokens", 1024 * (500.0 + 9000.5)),
                (2, "prompt_length/mean", 500.0),
                (2, "response_length/mean", 9000.5),
            ]
        )
    )
    assert big["response_tokens"][0] == 1024 * 9000.5
    assert big["note"][0] == "response tokens from float32 means: within ±1"


def test_two_sources_prefer_the_length_records_and_name_disagreements(tmp_path):
    counts = _expected_from_lengths(SAMPLE_LENGTHS)
    lines = []
    for step, (response, total) in counts.items():
        n = 64
        logged = total + (5 if step == 3 else 0)
        lines.append(
            f"step:{step} - response_length/mean:{response / n} - prompt_length/mean:"
            f"{(total - response) / n} - perf/total_num_tokens:{logged} - timing_s/step:1.0"
        )
    lines.append(
        "step:4 - response_length/mean:10.0 - prompt_length/mean:10.0 - perf/total_num_tokens:80"
    )
    log = tmp_path / "verl.log"
    log.write_text("\n".join(lines) + "\n")
    tokens = read_step_tokens(lengths=SAMPLE_LENGTHS, verl_logs=[log])
    assert tokens is not None
    frame = tokens.frame
    assert frame["source"].to_list() == ["lengths", "lengths", "lengths", "verl_log"]
    assert frame["total_tokens"].to_list()[:3] == [counts[s][1] for s in (1, 2, 3)]
    assert tokens.warnings == (
        f"step 3: the length records count {counts[3][1]:,} prompt + response tokens, the "
        f"VeRL log {counts[3][1] + 5:,}; the length records' counts are used",
    )
    with analyze([SAMPLE]) as run:
        warned = with_step_tokens(run, tokens).warnings
    assert any("token counts for step(s) 4 have no step in the run" in w for w in warned)


def test_bad_verl_log_is_one_line_before_anything_is_written(tmp_path):
    runner = CliRunner()
    empty = tmp_path / "empty.log"
    empty.write_text("no metrics here\n")
    out = tmp_path / "out"
    for bad, says in (
        (tmp_path / "missing.log", "no such file"),
        (empty, "no 'perf/total_num_tokens' in any step record"),
    ):
        for command in (["analyze", str(SAMPLE)], ["report", str(SAMPLE)]):
            result = runner.invoke(app, [*command, "--verl-log", str(bad), "--out", str(out)])
            assert result.exit_code == 2, result.output
            assert says in result.output and "Traceback" not in result.output
            assert not out.exists()
    with pytest.raises(InputError, match="no such file"):
        read_step_tokens(verl_logs=[tmp_path / "missing.log"])
    with pytest.raises(WorkloadInputError):
        read_step_tokens(verl_logs=[empty])
    no_records = tmp_path / "lengths"
    no_records.mkdir()
    with pytest.raises(InputError, match="no packed_lengths_step"):
        read_step_tokens(lengths=no_records)
    shutil.rmtree(no_records)
