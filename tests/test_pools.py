"""GPU pools (asynchronous RL): pool resolution, staleness, the balanced-pools bound, options.

The per-pool attribution itself is checked to the ns against the async generator's ground truth
in ``test_synth_async.py``; here each piece is checked against a computation written out in
the test (brute force over the marks, an exhaustive split search, per-ns interval sums).
"""

import itertools
import json
import subprocess
import sys

import polars as pl
import pytest
from nvtx_phases.analysis.aggregate.staleness import staleness_table
from nvtx_phases.analysis.attribute.pools import (
    UNPOOLED,
    parse_pool_option,
    resolve_pools,
)
from nvtx_phases.analysis.errors import InputError
from nvtx_phases.analysis.options import AnalyzeOptions
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.workload.whatif_pools import best_split
from nvtxp_testkit import SAMPLES, SPLIT_SAMPLE

from nvtx_phases.naming import pool_mark_text, samples_mark_text

PHASE_COLUMNS = {
    "trace": pl.String,
    "pid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "level": pl.Int64,
    "is_step": pl.Boolean,
    "attribution": pl.String,
}


def phases(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=PHASE_COLUMNS, orient="row")


def marks(rows: list[tuple[str, int, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(t, p, i, text, "nvtx_phases") for i, (t, p, text) in enumerate(rows)],
        schema={
            "trace": pl.String,
            "pid": pl.Int64,
            "ts_ns": pl.Int64,
            "text": pl.String,
            "domain": pl.String,
        },
        orient="row",
    )


def devices(rows: list[tuple[str, int, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"trace": pl.String, "pid": pl.Int64, "device": pl.String}, orient="row"
    )


NO_NAMES = pl.DataFrame(schema={"trace": pl.String, "pid": pl.Int64, "process_name": pl.String})
UUID_A, UUID_B, UUID_C = (f"GPU-{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}" for c in "abc")


def test_marked_pools_take_their_gpus_from_marks_and_operations():
    found = resolve_pools(
        phases([("t", 1, 0, 10, 0, True, "window"), ("r", 2, 0, 10, 0, False, "window")]),
        marks=marks(
            [
                ("t", 1, pool_mark_text("trainer")),
                ("w", 3, pool_mark_text("trainer", [UUID_A])),
                ("r", 2, pool_mark_text("rollout")),
                ("s", 4, pool_mark_text("rollout", [UUID_B])),
            ]
        ),
        # the trainer worker's operations also ran on C: its pool has both
        process_devices=devices([("w", 3, UUID_A), ("w", 3, UUID_C), ("s", 4, UUID_B)]),
        process_names=NO_NAMES,
        devices=[UUID_A, UUID_B, UUID_C],
    )
    assert found.source == "marks"
    assert found.devices == {"rollout": (UUID_B,), "trainer": (UUID_A, UUID_C)}
    members = {(t, p): pool for t, p, pool in found.members.rows()}
    assert members == {
        ("t", 1): "trainer",
        ("w", 3): "trainer",
        ("r", 2): "rollout",
        ("s", 4): "rollout",
    }


def test_pools_sharing_a_gpu_are_one_pool_with_a_warning():
    found = resolve_pools(
        phases([("t", 1, 0, 10, 0, True, "window")]),
        marks=marks(
            [
                ("w", 3, pool_mark_text("trainer", [UUID_A])),
                ("s", 4, pool_mark_text("rollout", [UUID_A])),
                ("x", 5, pool_mark_text("critic", [UUID_B])),
            ]
        ),
        process_devices=devices([]),
        process_names=NO_NAMES,
        devices=[UUID_A, UUID_B],
    )
    # the driver process marks no pool: it is unpooled (no GPU of its own)
    assert found.devices == {"critic": (UUID_B,), "rollout+trainer": (UUID_A,), UNPOOLED: ()}
    assert any("share GPU" in w and "rollout+trainer" in w for w in found.warnings)


def test_one_marked_pool_is_a_colocated_run():
    found = resolve_pools(
        phases([("t", 1, 0, 10, 0, True, "window")]),
        marks=marks([("w", 3, pool_mark_text("trainer", [UUID_A]))]),
        process_devices=devices([("w", 3, UUID_A), ("w", 4, UUID_B)]),
        process_names=NO_NAMES,
        devices=[UUID_A, UUID_B],
    )
    assert not found.split  # one pool of every GPU: outputs as before


def test_inferred_pools_follow_whose_phase_each_worker_range_runs_in():
    # two drivers whose phases overlap; worker 3's ranges sit inside driver 1's phase, worker
    # 4's inside driver 2's
    frame = phases(
        [
            ("d1", 1, 0, 100, 0, True, "window"),
            ("d1", 1, 0, 60, 1, False, "window"),
            ("d2", 2, 10, 90, 0, False, "window"),
            ("w3", 3, 5, 8, 0, False, "projection"),
            ("w4", 4, 70, 80, 0, False, "projection"),
        ]
    )
    found = resolve_pools(
        frame,
        marks=marks([]),
        process_devices=devices([("w3", 3, UUID_A), ("w4", 4, UUID_B)]),
        process_names=NO_NAMES,
        devices=[UUID_A, UUID_B],
    )
    assert found.source == "inferred"
    assert found.devices == {"d1:1": (UUID_A,), "d2:2": (UUID_B,)}
    assert any("inferred" in w for w in found.warnings)


def test_user_pools_match_files_processes_gpus_and_pids_each_once():
    frame = phases([("driver", 1, 0, 10, 0, True, "window")])
    names = pl.DataFrame(
        [("rollout_0", 7, "vllm-engine")],
        schema={"trace": pl.String, "pid": pl.Int64, "process_name": pl.String},
        orient="row",
    )
    used = devices([("trainer_0", 3, UUID_A), ("rollout_0", 7, UUID_B), ("other", 9, UUID_C)])
    found = resolve_pools(
        frame,
        marks=marks([]),
        process_devices=used,
        process_names=names,
        devices=[UUID_A, UUID_B, UUID_C],
        given={"trainer": ("driver", "trainer_*"), "rollout": ("vllm-*", "pid:9")},
    )
    assert found.source == "user"
    assert found.devices == {"rollout": (UUID_B, UUID_C), "trainer": (UUID_A,)}
    with pytest.raises(InputError, match="matches no file, process or GPU"):
        resolve_pools(
            frame,
            marks=marks([]),
            process_devices=used,
            process_names=names,
            devices=[UUID_A],
            given={"x": ("nothing_*",)},
        )
    with pytest.raises(InputError, match="belongs to one pool"):
        resolve_pools(
            frame,
            marks=marks([]),
            process_devices=used,
            process_names=names,
            devices=[UUID_A],
            given={"a": ("trainer_*",), "b": ("pid:3",)},
        )


def test_pool_option_text_is_parsed_or_refused_in_one_line():
    assert parse_pool_option(["rollout=rollout_*,pid:3", "trainer=driver"]) == {
        "rollout": ("rollout_*", "pid:3"),
        "trainer": ("driver",),
    }
    for bad in (["rollout"], ["=x"], ["rollout="], ["a=x", "a=y"]):
        with pytest.raises(InputError):
            parse_pool_option(bad)
    with pytest.raises(InputError, match="pools: expected"):
        AnalyzeOptions(pools={"rollout": "rollout_*"})  # a string, not a list of patterns


def test_cli_pool_errors_are_one_line():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvtx_phases.analysis.cli",
            "analyze",
            str(SAMPLES / "grpo_synthetic.sqlite"),
            "--pool",
            "bad",
            "--no-figures",
            "--out",
            "/tmp/nvtxp-pool-err",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert "--pool 'bad': expected NAME=PATTERN" in run.stderr


def test_staleness_is_the_version_lag_of_each_steps_samples():
    versions = {1: (0, {0: 8}), 2: (1, {0: 3, 1: 5}), 3: (3, {1: 2, 2: 2, 3: 4}), 4: (4, {})}
    texts = [("t", 1, samples_mark_text(s, v, d)) for s, (v, d) in versions.items()]
    texts.append(("t", 1, "nvtx_phases.samples step=x"))  # not a samples mark
    got = staleness_table(marks(texts))
    assert got is not None
    for step, (version, counts) in versions.items():
        row = got.filter(pl.col("step") == step).row(0, named=True)
        lags = [version - v for v, n in counts.items() for _ in range(n)]
        assert row["version"] == version and row["n_samples"] == len(lags)
        if not lags:  # no samples: no staleness, not 0
            assert row["mean_lag"] is None and row["stale_share"] is None
            continue
        assert row["min_lag"] == min(lags) and row["max_lag"] == max(lags)
        assert row["mean_lag"] == pytest.approx(sum(lags) / len(lags))
        assert row["stale_share"] == pytest.approx(sum(1 for x in lags if x >= 1) / len(lags))
    assert staleness_table(marks([("t", 1, "hello")])) is None


def test_best_split_is_the_exhaustive_minimum():
    for trainer_s, rollout_s, gpus in itertools.product(
        (0.5, 3.0, 7.0), (0.2, 4.0, 9.0), (2, 3, 8)
    ):
        times = {g: max(trainer_s / g, rollout_s / (gpus - g)) for g in range(1, gpus)}
        best = min(times.values())
        g, bound = best_split(trainer_s, rollout_s, gpus)
        assert (
            bound == best
            and times[g] == best
            and g == min(k for k, v in times.items() if v == best)
        )


def test_user_pools_on_the_ray_sample_conserve_each_pools_gpu_time():
    """Two pools given on a colocated Ray-style capture: each pool's balance adds up."""
    run = analyze(SPLIT_SAMPLE, pools={"a": ["driver", "worker_rank0"], "b": ["worker_rank1"]})
    assert run.pools is not None and set(run.pools["pool"]) == {"a", "b"}
    # each pool's total from the raw operations of its GPU, summed here
    with run:
        ops = run.gpu_activity.select("device", "dur_ns").collect()
    for row in run.pools.iter_rows(named=True):
        mine = ops.filter(pl.col("device").is_in(row["devices"].split(",")))
        assert row["total_gpu_ns"] == mine["dur_ns"].sum()
        assert row["attributed_gpu_ns"] + row["unattributed_gpu_ns"] == row["total_gpu_ns"]
    # pool b's process has no driver phases: all of its GPU time is window-unattributed
    b = run.pools.filter(pl.col("pool") == "b").row(0, named=True)
    assert b["attributed_gpu_ns"] == 0
    assert UNPOOLED not in set(run.pools["pool"])


# --- on the asynchronous capture (synth --async) -----------------------------------------------

ROW_FIGURES = ("wall_ns", "n_devices", "gpu_busy_ns", "idle_ns", "kernel_ns", "nccl_ns")


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    from nvtx_phases.analysis.synth import AsyncConfig, generate_async

    out = tmp_path_factory.mktemp("async_pools")
    generate_async(out, AsyncConfig(steps=3, seed=5))
    return out


def window_rows(run) -> dict:
    rows = run.phases.filter(pl.col("attribution") == "window")
    return {
        (r["pool"], r["trace"], r["step"], r["path"]): tuple(r[c] for c in ROW_FIGURES)
        for r in rows.iter_rows(named=True)
    }


def without_pool_marks(folder, out):
    """A copy of the capture whose processes mark no pool (plain sqlite3 on the copies)."""
    import shutil
    import sqlite3

    out.mkdir()
    for path in folder.glob("*.sqlite"):
        shutil.copy(path, out / path.name)
        con = sqlite3.connect(out / path.name)
        ids = [
            i
            for (i,) in con.execute(
                "SELECT id FROM StringIds WHERE value LIKE 'nvtx_phases.pool %'"
            )
        ]
        con.execute(f"DELETE FROM NVTX_EVENTS WHERE textId IN ({','.join('?' * len(ids))})", ids)
        con.commit()
        con.close()
    shutil.copy(folder / "power_nvml.parquet", out / "power_nvml.parquet")
    return out


def test_inferred_and_given_pools_give_the_marked_pools_numbers(async_run, tmp_path):
    marked = analyze(async_run)
    assert marked.pools is not None and set(marked.pools["source"]) == {"marks"}
    expected = window_rows(marked)
    names = {"trainer": "trainer_controller:1000", "rollout": "rollouter:1100"}
    inferred = analyze(without_pool_marks(async_run, tmp_path / "bare"))
    assert set(inferred.pools["source"]) == {"inferred"}
    assert any("GPU pools inferred" in w for w in inferred.warnings)
    renamed = {(names[p], t, s, path): v for (p, t, s, path), v in expected.items()}
    assert window_rows(inferred) == renamed
    given = analyze(
        tmp_path / "bare",
        pools={"trainer": ["trainer_*"], "rollout": ["rollout*"]},
    )
    assert set(given.pools["source"]) == {"user"}
    assert window_rows(given) == expected


def test_idle_causes_add_up_to_each_pools_idle_over_its_span(async_run):
    truth = json.loads((async_run / "ground_truth.json").read_text())
    run = analyze(async_run)
    for pool in truth["pools"]:
        mine = run.idle_causes.filter(pl.col("pool") == pool["pool"])
        assert mine["idle_ns"].sum() == pool["span_idle_ns"]
        span = pool["span_end_ns"] - pool["span_start_ns"]
        assert mine["wall_ns"].sum() == span


def test_balanced_pools_bound_from_the_truths_busy_times(async_run, tmp_path):
    """The bound recomputed here from the truth's rows, split by split."""
    from nvtx_phases.analysis.jobs import analyze_to, whatif_to

    truth = json.loads((async_run / "ground_truth.json").read_text())
    with analyze_to([async_run], tmp_path / "run", figures=False):
        pass
    whatif_to([tmp_path / "run"], tmp_path / "whatif")
    rows = pl.read_csv(tmp_path / "whatif" / "whatif.csv").filter(
        pl.col("bound") == "balanced_pools"
    )
    steps = [w for w in truth["window_phases"] if w["phase"] == "step"]
    versions = [w for w in truth["window_phases"] if w["phase"] == "version"]
    rollout_s = sum(w["gpu_busy_ns"] for w in versions) / 1e9 / len(steps)
    gpus = {p["pool"]: p["n_devices"] for p in truth["pools"]}
    total = gpus["trainer"] + gpus["rollout"]
    assert rows.height == len(steps)
    for w in steps:
        trainer_s = w["gpu_busy_ns"] / 1e9
        best = min(max(trainer_s / g, rollout_s / (total - g)) for g in range(1, total))
        row = rows.filter(pl.col("step") == w["step"]).row(0, named=True)
        assert row["bound_s"] == pytest.approx(best, abs=1e-9)
        assert row["measured_s"] == pytest.approx(w["wall_ns"] / 1e9, abs=1e-9)
        assert "best split here" in row["assumption"]
    overlap = pl.read_csv(tmp_path / "whatif" / "whatif.csv").filter(
        pl.col("bound") == "overlap_gen_train"
    )
    assert overlap["bound_s"].null_count() == overlap.height  # already asynchronous


def test_report_of_an_async_run_draws_each_figure_per_pool(async_run, tmp_path):
    from nvtx_phases.analysis.jobs import build_report

    build_report([async_run], tmp_path / "rep")
    figures = {p.stem for p in (tmp_path / "rep" / "figures").glob("*.png")}
    for stem in ("phase_time_per_step", "busy_idle_per_phase", "phase_share"):
        assert {f"{stem}__pool-trainer", f"{stem}__pool-rollout"} <= figures
    assert "idle_by_cause" in figures
    # each figure's data beside it; the idle figure's is the table's totals
    data = pl.read_csv(tmp_path / "rep" / "figures" / "idle_by_cause.csv")
    table = pl.read_csv(tmp_path / "rep" / "idle_causes.csv")
    for (pool, cause), rows in table.group_by("pool", "cause"):
        drawn = data.filter((pl.col("pool") == pool) & (pl.col("cause") == cause))
        assert drawn["idle_ns"].item() == rows["idle_ns"].sum()
    page = (tmp_path / "rep" / "report.md").read_text()
    for title in ("## GPU pools", "## Idle GPU time by cause, per pool", "## Staleness"):
        assert title in page


def test_nccl_overlap_of_a_pooled_run_counts_each_rows_own_pool(async_run, tmp_path):
    """nccl_overlap.csv's window rows: the truth's NCCL time, on the row's pool's GPUs only."""
    from nvtx_phases.analysis.jobs import analyze_to

    truth = json.loads((async_run / "ground_truth.json").read_text())
    with analyze_to([async_run], tmp_path / "run", figures=False):
        pass
    table = pl.read_csv(tmp_path / "run" / "nccl_overlap.csv").filter(
        pl.col("attribution") == "window"
    )
    gpus = {p["pool"]: set(p["devices"]) for p in truth["pools"]}
    for w in truth["window_phases"]:
        mine = table.filter(
            (pl.col("trace") == w["trace"])
            & (pl.col("step") == w["step"])
            & (pl.col("path") == w["path"])
        )
        assert set(mine["device"]) <= gpus[w["pool"]]
        # the generator's NCCL kernels of one GPU never overlap: their union is their sum
        assert mine["nccl_ns"].sum() == w["nccl_ns"], (w["path"], w["step"])
