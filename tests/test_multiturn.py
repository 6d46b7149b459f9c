"""Multi-turn tool-use and DAPO-filter tables of ``lengths analyze`` and the report.

Each number is checked on PolyTrace's real records against a computation written here with the
standard library over the raw JSON (never the package's code path), and on small inputs with
answers known by hand; bad inputs give one error line.
"""

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.jobs import analyze_lengths
from nvtxp_testkit import SAMPLES, shared_path
from typer.testing import CliRunner

runner = CliRunner()
#: a full step (2,048 samples) and the partial one (47 samples, no tool call: empty lists)
REAL_STEPS = ("multiturn_workload_step_4.jsonl", "multiturn_workload_step_5.jsonl")


def raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def p(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), by hand."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def latency(r: dict) -> float:
    return sum(t["engine_latency_s"] for t in r["turns"]) + sum(
        c["latency_s"] for c in r["tool_calls"]
    )


def slowest(rows: list[dict]) -> list[dict]:
    order = sorted(rows, key=lambda r: (-latency(r), r["prompt_group_id"], r["sample_id"]))
    return order[: math.ceil(len(rows) / 10)]


def expected_steps(rows: list[dict]) -> dict[int, dict]:
    """multiturn_steps.csv's row of each step, from the raw records."""
    by_step = defaultdict(list)
    for r in rows:
        if not r.get("validate"):
            by_step[r["step"]].append(r)
    out = {}
    for step, rs in by_step.items():
        turns = [len(r["turns"]) for r in rs]
        engine = sum(t["engine_latency_s"] for r in rs for t in r["turns"])
        tool = sum(c["latency_s"] for r in rs for c in r["tool_calls"])
        calls = sum(len(r["tool_calls"]) for r in rs)
        prompt = sum(t["prompt_tokens"] for r in rs for t in r["turns"])
        cached = sum(t["cached_tokens"] for r in rs for t in r["turns"])
        resp = sum(r["final_response_len"] for r in rs)
        loss = sum(r["final_response_loss_len"] for r in rs)
        slow = slowest(rs)
        out[step] = {
            "samples": len(rs),
            "turns_mean": statistics.mean(turns),
            "turns_p50": statistics.median(turns),
            "turns_p90": p(turns, 0.9),
            "turns_max": max(turns),
            "turns_total": sum(turns),
            "tool_calls": calls,
            "engine_latency_sum_s": engine,
            "tool_latency_sum_s": tool,
            "tool_share_of_latency_fraction": tool / (tool + engine),
            "engine_share_of_latency_fraction": engine / (tool + engine),
            "engine_turn_latency_mean_s": engine / sum(turns),
            "tool_call_latency_mean_s": tool / calls if calls else None,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "prefix_cache_hit_fraction": cached / prompt,
            "response_tokens": resp,
            "loss_tokens": loss,
            "loss_masked_fraction": 1 - loss / resp,
            "sample_latency_p50_s": statistics.median(latency(r) for r in rs),
            "sample_latency_max_s": max(latency(r) for r in rs),
            "slowest_sample_turns": len(slow[0]["turns"]),
            "slowest_decile_samples": len(slow),
            "slowest_decile_turns_mean": statistics.mean(len(r["turns"]) for r in slow),
            "slowest_decile_turns_over_p50": statistics.mean(len(r["turns"]) for r in slow)
            / statistics.median(turns),
        }
    return out


def close(got: dict, want: dict) -> None:
    for key, value in want.items():
        if value is None or isinstance(value, bool):
            assert got[key] == value, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The two real step files analyzed, with their raw records."""
    folder = shared_path("polytrace/search_r1")
    files = [folder / name for name in REAL_STEPS]
    out = tmp_path_factory.mktemp("mt")
    done = analyze_lengths(files, out, fit=False)
    return out, done, [r for f in files for r in raw(f)]


def test_real_multiturn_steps_match_the_raw_records(real):
    out, done, rows = real
    table = pl.read_csv(out / "multiturn_steps.csv")
    assert done.stats is None and done.multiturn is not None
    assert table["step"].to_list() == [4, 5]
    want = expected_steps(rows)
    for got in table.iter_rows(named=True):
        close(got, want[got["step"]])
    # the records' other mask: the run-length-encoded loss mask adds up to the same tokens
    for r in rows:
        assert (
            sum(n for m, n in r["response_loss_mask_rle"] if m == 1) == r["final_response_loss_len"]
        )
    # the numbers the README quotes (step 4)
    s4 = table.row(0, named=True)
    assert s4["samples"] == 2048 and s4["tool_calls"] == 3347 and s4["turns_max"] == 5
    assert round(s4["prefix_cache_hit_fraction"], 4) == 0.6076
    assert round(s4["tool_share_of_latency_fraction"], 4) == 0.0017
    assert round(s4["loss_masked_fraction"], 3) == 0.832 and s4["slowest_decile_samples"] == 205


def test_real_turn_count_and_turn_tables_match_the_raw_records(real):
    out, _, rows = real
    counts = pl.read_csv(out / "multiturn_turn_counts.csv")
    for step in (4, 5):
        rs = [r for r in rows if r["step"] == step]
        slow = slowest(rs)
        for n in sorted({len(r["turns"]) for r in rs}):
            group = [r for r in rs if len(r["turns"]) == n]
            lat = [latency(r) for r in group]
            got = counts.filter((pl.col("step") == step) & (pl.col("turns") == n)).row(
                0, named=True
            )
            n_slow = sum(1 for r in slow if len(r["turns"]) == n)
            close(
                got,
                {
                    "samples": len(group),
                    "tool_calls": sum(len(r["tool_calls"]) for r in group),
                    "sample_latency_mean_s": statistics.mean(lat),
                    "sample_latency_p50_s": statistics.median(lat),
                    "sample_latency_max_s": max(lat),
                    "slowest_decile_samples": n_slow,
                    "share_of_samples_fraction": len(group) / len(rs),
                    "share_of_slowest_decile_fraction": n_slow / len(slow),
                },
            )
        assert counts.filter(pl.col("step") == step)["samples"].sum() == len(rs)
    # the README's: step 4's samples of 4-5 turns, of the step and of its slowest decile
    many = counts.filter((pl.col("step") == 4) & (pl.col("turns") >= 4))
    assert round(many["share_of_samples_fraction"].sum(), 3) == 0.154
    assert round(many["share_of_slowest_decile_fraction"].sum(), 3) == 0.761
    turns = pl.read_csv(out / "multiturn_turns.csv")
    first = turns.filter((pl.col("step") == 4) & (pl.col("turn") <= 1))
    assert [round(x, 3) for x in first["prefix_cache_hit_fraction"]] == [0.939, 0.383]
    for got in turns.iter_rows(named=True):
        at = [
            r["turns"][got["turn"]]
            for r in rows
            if r["step"] == got["step"] and len(r["turns"]) > got["turn"]
        ]
        prompt, cached = sum(t["prompt_tokens"] for t in at), sum(t["cached_tokens"] for t in at)
        close(
            got,
            {
                "turns": len(at),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "engine_latency_mean_s": statistics.mean(t["engine_latency_s"] for t in at),
                "prefix_cache_hit_fraction": cached / prompt,
            },
        )


def test_real_dapo_steps_match_the_raw_records(tmp_path):
    file = shared_path("polytrace/dapo/20260614_023133/dapo_filter_indices.jsonl")
    done = analyze_lengths([file], tmp_path, fit=False)
    rows = raw(file)
    table = pl.read_csv(tmp_path / "dapo_steps.csv")
    assert table["trainer_step"].to_list() == sorted({r["trainer_step"] for r in rows})
    for got in table.iter_rows(named=True):
        rs = [r for r in rows if r["trainer_step"] == got["trainer_step"]]
        gen = sum(r["prompt_count"] for r in rs)
        kept = sum(len(r["kept_prompt_indices"]) for r in rs)  # the lists, not the counts
        used = sum(len(r["used_prompt_indices"]) for r in rs)
        close(
            got,
            {
                "generation_batches": len(rs),
                "first_workload_step": min(r["workload_step"] for r in rs),
                "last_workload_step": max(r["workload_step"] for r in rs),
                "prompts_generated": gen,
                "prompts_kept": kept,
                "prompts_used": used,
                "responses_generated": sum(r["prompt_count"] * r["n_sampling"] for r in rs),
                "train_batch_size": rs[0]["train_batch_size"],
                "kept_of_generated_fraction": kept / gen,
                "used_of_generated_fraction": used / gen,
                "used_of_kept_fraction": used / kept,
                "batch_filled": used >= rs[0]["train_batch_size"],
            },
        )
    # the README's numbers: 4 trainer steps from 6 generation batches; the last one is cut short
    assert table["generation_batches"].to_list() == [2, 2, 1, 1]
    assert table["prompts_used"].to_list() == [32, 32, 32, 30]
    assert done.warnings == [] and any("trainer step(s) 4 (30 of 32)" in n for n in done.notes)


def sample(step, group, sid, turns, tools, resp=None, loss=None, validate=False):
    record = {
        "step": step,
        "prompt_group_id": group,
        "sample_id": sid,
        "validate": validate,
        "turns": [
            {"turn": i, "prompt_tokens": pt, "cached_tokens": ct, "engine_latency_s": e}
            for i, (pt, ct, e) in enumerate(turns)
        ],
        "tool_calls": [{"turn": 0, "latency_s": t, "status": "success"} for t in tools],
    }
    if resp is not None:
        record |= {"final_response_len": resp, "final_response_loss_len": loss}
    return record


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_constructed_multiturn_step_has_hand_known_numbers(tmp_path):
    write(
        tmp_path / "multiturn_workload_step_1.jsonl",
        [
            sample(1, 0, 0, [(100, 0, 2.0), (300, 100, 3.0)], [1.0], resp=200, loss=50),
            sample(1, 0, 1, [(100, 50, 1.0)], [], resp=40, loss=40),
            sample(1, 0, 2, [(999, 999, 99.0)], [9.0], resp=9, loss=9, validate=True),
        ],
    )
    done = analyze_lengths([tmp_path], tmp_path / "out", fit=False)
    got = pl.read_csv(tmp_path / "out" / "multiturn_steps.csv").row(0, named=True)
    close(
        got,
        {
            "samples": 2,  # the validation rollout is left out
            "turns_mean": 1.5,
            "turns_p50": 1.5,
            "turns_p90": 1.9,
            "turns_max": 2,
            "tool_calls": 1,
            "engine_latency_sum_s": 6.0,
            "tool_latency_sum_s": 1.0,
            "tool_share_of_latency_fraction": 1 / 7,
            "engine_turn_latency_mean_s": 2.0,
            "tool_call_latency_mean_s": 1.0,
            "prefix_cache_hit_fraction": 150 / 500,
            "loss_masked_fraction": 1 - 90 / 240,
            "sample_latency_p50_s": 3.5,
            "sample_latency_max_s": 6.0,
            "slowest_sample_turns": 2,
            "slowest_decile_samples": 1,  # ⌈2/10⌉
            "slowest_decile_turns_mean": 2.0,
        },
    )
    assert done.notes and "sample-seconds" in done.notes[0]


def test_records_without_loss_fields_say_not_available(tmp_path):
    write(tmp_path / "multiturn_workload_step_0.jsonl", [sample(0, 0, 0, [(10, 5, 1.0)], [])])
    done = analyze_lengths([tmp_path], tmp_path / "out", fit=False)
    got = pl.read_csv(tmp_path / "out" / "multiturn_steps.csv").row(0, named=True)
    # null, not 0; and a step without tool calls has no mean tool latency, its share is 0
    assert got["loss_masked_fraction"] is None and got["response_tokens"] is None
    assert got["tool_call_latency_mean_s"] is None and got["tool_share_of_latency_fraction"] == 0
    assert any("loss_masked_fraction not available" in n for n in done.notes)


def test_constructed_dapo_steps(tmp_path):
    def batch(trainer, gen, kept, used, kept_listed=None):
        return {
            "workload_step": trainer * 10 + gen,
            "trainer_step": trainer,
            "gen_batch_index": gen,
            "prompt_count": 96,
            "n_sampling": 8,
            "train_batch_size": 32,
            "kept_prompt_count": kept,
            "used_prompt_count": used,
            "kept_prompt_indices": list(range(kept if kept_listed is None else kept_listed)),
            "used_prompt_indices": list(range(used)),
        }

    file = write(
        tmp_path / "dapo_filter_indices.jsonl",
        [batch(1, 1, 20, 20), batch(1, 2, 30, 12), batch(2, 1, 40, 32, kept_listed=39)],
    )
    done = analyze_lengths([file], tmp_path / "out", fit=False)
    table = pl.read_csv(tmp_path / "out" / "dapo_steps.csv")
    assert table.select(
        "trainer_step", "generation_batches", "prompts_generated", "prompts_kept", "prompts_used"
    ).rows() == [(1, 2, 192, 50, 32), (2, 1, 96, 40, 32)]
    close(
        table.row(0, named=True),
        {"kept_of_generated_fraction": 50 / 192, "used_of_kept_fraction": 32 / 50},
    )
    assert table["batch_filled"].to_list() == [True, True]
    assert table["responses_generated"].to_list() == [1536, 768]
    assert len(done.warnings) == 1 and "kept_prompt_indices" in done.warnings[0]
    write(file, [batch(1, 1, 20, 21)])  # uses more than it kept
    done = analyze_lengths([file], tmp_path / "out2", fit=False)
    assert len(done.warnings) == 1 and "inconsistent records" in done.warnings[0]


def one_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


GOOD = json.dumps(sample(0, 0, 0, [(10, 5, 1.0)], [0.5], resp=4, loss=2))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("multiturn_workload_step_0.jsonl", GOOD + "\n" + GOOD[:40] + "\n", "not JSON lines"),
        (
            "multiturn_workload_step_0.jsonl",
            '{"step": 0, "rank": 0, "dp_rank": 0, "input": 5, "output": [3]}\n',
            "lacks field(s) turns, tool_calls of the multiturn_workload layout",
        ),
        (
            "multiturn_workload_step_0.jsonl",
            '{"step": 0, "turns": [{"prompt_tokens": 1}], "tool_calls": []}\n',
            "turns entries lack field(s) cached_tokens, engine_latency_s",
        ),
        (
            "multiturn_workload_step_0.jsonl",
            '{"step": 0, "turns": 3, "tool_calls": []}\n',
            "field turns is not a list of objects",
        ),
        (
            "dapo_filter_indices.jsonl",
            GOOD + "\n",
            "lacks field(s) trainer_step, prompt_count, n_sampling, train_batch_size",
        ),
        (
            "dapo_filter_indices.jsonl",
            '{"trainer_step": 1, "prompt_count": "many", "n_sampling": 8, '
            '"train_batch_size": 32, "kept_prompt_count": 1, "used_prompt_count": 1}\n',
            "a field has the wrong type",
        ),
    ],
)
def test_bad_records_give_one_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    result = runner.invoke(app, ["lengths", "analyze", str(tmp_path), "--out", str(tmp_path / "o")])
    error = one_error(result)
    assert error.startswith(f"error: {tmp_path / name}: ") and message in error, error


def test_foreign_or_missing_inputs_give_one_line(tmp_path):
    other = write(tmp_path / "records.jsonl", [{"a": 1}])
    error = one_error(runner.invoke(app, ["lengths", "analyze", str(other)]))
    assert "not a record file this command reads" in error
    error = one_error(runner.invoke(app, ["lengths", "analyze", str(tmp_path / "none")]))
    assert "no packed_lengths_step_*.jsonl, multiturn_workload_step_*.jsonl" in error
    write(tmp_path / "multiturn_workload_step_0.jsonl", [json.loads(GOOD)])
    args = ["lengths", "analyze", str(tmp_path / "multiturn_workload_step_0.jsonl")]
    error = one_error(runner.invoke(app, [*args, "--run", str(tmp_path)]))
    assert "--run and --fit need packed_lengths_step_*.jsonl records" in error


def test_cli_prints_the_tables(tmp_path):
    write(tmp_path / "multiturn_workload_step_0.jsonl", [json.loads(GOOD)])
    result = runner.invoke(
        app, ["lengths", "analyze", str(tmp_path), "--out", str(tmp_path / "o")], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    assert "Multi-turn rollouts per step" in result.output and "sample-seconds" in result.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "multiturn_steps.csv",
        "multiturn_turn_counts.csv",
        "multiturn_turns.csv",
    ]


def test_report_has_the_multiturn_and_dapo_sections(tmp_path):
    lengths = tmp_path / "records"
    lengths.mkdir()
    for src in (
        shared_path("polytrace/search_r1/multiturn_workload_step_5.jsonl"),
        shared_path("polytrace/dapo/20260614_023133/dapo_filter_indices.jsonl"),
    ):
        (lengths / src.name).write_bytes(src.read_bytes())
    trace = SAMPLES / "grpo_synthetic.sqlite"
    out = tmp_path / "rep"
    result = runner.invoke(
        app, ["report", str(trace), "--lengths", str(lengths), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert (
        "## Multi-turn rollouts per step" in text and "## DAPO filtering per trainer step" in text
    )
    dapo = pl.read_csv(out / "tables" / "dapo_filtering_per_trainer_step.csv")
    assert dapo["prompts_used"].to_list() == [32, 32, 32, 30]
    assert "did not fill the train batch" in text  # the note, among the report's warnings
    html = (out / "report.html").read_text()
    for title in (
        "Multi-turn rollouts per step (latencies summed over samples, not wall time)",
        "Multi-turn prefix cache by turn",
        "DAPO filtering per trainer step (prompts generated, kept, used)",
    ):
        assert f"<h2>{title}</h2>" in html, title
    assert "<th>tool share of latency</th>" in html and "<th>turns total</th>" not in html
    shown = pl.read_csv(out / "tables" / "multi_turn_rollouts_per_step.csv")
    assert shown["samples"].to_list() == [47] and "prompt_tokens" not in shown.columns


def test_real_partial_step_is_named(real):
    _, done, _ = real
    # step 5 of the real log holds 47 samples against 2,048: said, its numbers still given
    assert any(
        "step(s) 5 (47) hold under half the samples of the largest step (2,048)" in n
        for n in done.notes
    ), done.notes


def test_zero_denominators_are_null_not_zero(tmp_path):
    # a sample without turns or tool calls: no per-turn latency, no cache ratio, no p50 ratio
    write(tmp_path / "multiturn_workload_step_0.jsonl", [sample(0, 0, 0, [], [], resp=0, loss=0)])
    analyze_lengths([tmp_path], tmp_path / "out", fit=False)
    got = pl.read_csv(tmp_path / "out" / "multiturn_steps.csv").row(0, named=True)
    for column in (
        "engine_turn_latency_mean_s",
        "tool_call_latency_mean_s",
        "tool_share_of_latency_fraction",
        "prefix_cache_hit_fraction",
        "loss_masked_fraction",
        "slowest_decile_turns_over_p50",
    ):
        assert got[column] is None, column
    assert got["samples"] == 1 and got["turns_max"] == 0


def test_cli_reads_each_mix_of_record_kinds(tmp_path):
    """Only multi-turn, only DAPO, both, and both beside packed lengths: each works."""
    real_mt = shared_path("polytrace/search_r1/multiturn_workload_step_5.jsonl")
    run = shared_path("polytrace/dapo/20260614_023133")
    kinds = {
        "multiturn": [real_mt],
        "dapo": [run / "dapo_filter_indices.jsonl"],
        "both": [real_mt, run / "dapo_filter_indices.jsonl"],
        "all": [real_mt, *sorted(run.iterdir())],
    }
    csvs = {
        "multiturn": {"multiturn_steps.csv", "multiturn_turn_counts.csv", "multiturn_turns.csv"},
        "dapo": {"dapo_steps.csv"},
    }
    for name, sources in kinds.items():
        folder = tmp_path / name
        folder.mkdir()
        for src in sources:
            (folder / src.name).write_bytes(src.read_bytes())
        out = tmp_path / f"{name}_out"
        args = ["lengths", "analyze", str(folder), "--out", str(out), "--no-fit"]
        result = runner.invoke(app, args, terminal_width=200)
        assert result.exit_code == 0, (name, result.output)
        written = {p.name for p in out.iterdir() if p.is_file()}
        want = set().union(*(csvs[k] for k in csvs if k == name or name in ("both", "all")))
        if name == "all":
            want |= {"length_stats.csv", "length_drift.csv", "rank_imbalance.csv"}
        assert written == want, name
        assert ("Response lengths per step" in result.output) == (name == "all")
        assert ("DAPO filtering per trainer step" in result.output) == (name != "multiturn")
    # the packed lengths beside them are those of the run: 96 prompts × 8 per step
    stats = pl.read_csv(tmp_path / "all_out" / "length_stats.csv")
    want_n = {
        int(f.stem.rsplit("_", 1)[1]): sum(len(r["output"]) for r in raw(f))
        for f in sorted(run.glob("packed_lengths_step_*.jsonl"))
    }
    assert dict(zip(stats["step"], stats["n_responses"], strict=True)) == want_n


def test_a_null_field_is_an_error_not_a_zero(tmp_path):
    # polars types a turn without engine_latency_s as null within the others' struct
    bad = sample(0, 0, 1, [(10, 5, 1.0)], [])
    del bad["turns"][0]["engine_latency_s"]
    write(tmp_path / "multiturn_workload_step_0.jsonl", [json.loads(GOOD), bad])
    error = one_error(runner.invoke(app, ["lengths", "analyze", str(tmp_path)]))
    assert "1 turns entries lack field engine_latency_s" in error, error
    dapo = tmp_path / "d"
    dapo.mkdir()
    row = {
        "trainer_step": 1,
        "prompt_count": 96,
        "n_sampling": 8,
        "train_batch_size": 32,
        "kept_prompt_count": 3,
        "used_prompt_count": 3,
    }
    write(dapo / "dapo_filter_indices.jsonl", [row, {**row, "kept_prompt_count": None}])
    error = one_error(runner.invoke(app, ["lengths", "analyze", str(dapo)]))
    assert "1 record(s) lack field kept_prompt_count" in error, error


def test_the_tables_for_study_are_the_written_ones(real):
    out, _, _ = real
    from nvtx_phases.analysis.workload.records import dapo_step_table, multiturn_step_table

    folder = shared_path("polytrace/search_r1")
    got = multiturn_step_table([folder / name for name in REAL_STEPS])
    assert got is not None
    assert got.equals(pl.read_csv(out / "multiturn_steps.csv", schema=got.schema))
    dapo_run = shared_path("polytrace/dapo/20260614_023133")
    steps = dapo_step_table([dapo_run])
    assert steps is not None and steps["prompts_used"].to_list() == [32, 32, 32, 30]
    assert multiturn_step_table([dapo_run]) is None and dapo_step_table([folder]) is None
