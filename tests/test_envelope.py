"""Power envelope per phase (power_envelope.csv) against the synthetic run's exact power model.

What is exact, and why. The synthetic GPUs draw constant levels (idle 90 W plus a level per
worker range, multiples of 10 W) and the sampler reads an exact energy counter rounded to whole
mJ every 100 µs. A reading wholly inside a constant stretch therefore gains level × 100 µs, a
whole number of mJ: its counter-derived power is the level exactly. Only where the rounding of
the counter flips (its exact value ends in .5 mJ) is one reading off, by at most 1 mJ / 100 µs
= 10 W. So p50 and p95 equal the model's level exactly (the level holds > 80% of every phase's
time) and max lies in [level, level + 10 W]. Energy per (range, GPU) is exact to 1 mJ (0.5 mJ
of counter rounding at each end; no power step lies within one read of a driver phase's ends),
and a ramp, a second difference of the interpolated counter at s−w, s, s+w, to
(0.5 + 2·0.5 + 0.5) mJ / w².
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.energy.envelope import (
    COUNTER,
    RAMP_READINGS,
    READING,
    device_series,
    envelope,
    power_envelope,
)
from nvtx_phases.analysis.render.outputs.files import MANIFEST
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth import SynthConfig, generate
from nvtx_phases.analysis.synth.config import GRPO_PHASES
from nvtx_phases.analysis.synth.constants import PHASE_POWER_W
from nvtx_phases.analysis.synth.model import GrpoBuilder
from nvtxp_testkit import SAMPLES
from typer.testing import CliRunner

CFG = SynthConfig(steps=2, ranks=2, kernels_per_phase=8, seed=11, lengths=False)
READ_NS = CFG.power_interval_ns
#: one mJ of counter resolution over one read, in W
QUANTUM_W = 1e-3 / (READ_NS / 1e9)


def levels(cfg: SynthConfig) -> dict[str, float]:
    """Each driver phase's power (W) per GPU in the model: idle plus its worker range's level."""
    return {
        f"step/{phase}": cfg.idle_power_w + (PHASE_POWER_W[worker] if worker else 0.0)
        for phase, worker, _ in GRPO_PHASES
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = generate(tmp_path_factory.mktemp("envelope") / "run.sqlite", CFG)[0]
    truth = json.loads(path.with_name(path.stem + ".ground_truth.json").read_text())["energy"]
    result = analyze([path])
    builder = GrpoBuilder(CFG)
    builder.build()
    yield result, power_envelope(result), truth, builder
    result.close()


def test_rows_per_phase_gpu_and_node(run):
    _, env, _, _ = run
    paths = ["step", *levels(CFG)]
    devices = ["run:0", "run:1"]
    expected = [(p, "gpu", d) for p in paths for d in devices] + [(p, "node", None) for p in paths]
    assert sorted(env.select("path", "scope", "device").iter_rows(), key=str) == sorted(
        expected, key=str
    )
    assert env["path"].unique(maintain_order=True).to_list() == paths  # in time order
    assert set(env["power_from"]) == {COUNTER}
    assert set(env["n_ranges"]) == {CFG.steps}
    assert set(env.filter(pl.col("scope") == "node")["host"]) == {"synthetic"}
    assert set(env.filter(pl.col("scope") == "node")["n_gpus"]) == {2}
    assert not env["few_samples"].any()
    assert env["ramp_window_ms"].to_list() == [RAMP_READINGS * READ_NS / 1e6] * env.height


def test_percentiles_equal_the_model_levels(run):
    _, env, _, _ = run
    for path, level in levels(CFG).items():
        gpus = env.filter((pl.col("path") == path) & (pl.col("scope") == "gpu"))
        assert gpus["p50_w"].to_list() == [level, level], path
        assert gpus["p95_w"].to_list() == [level, level], path
        assert all(level <= m <= level + QUANTUM_W for m in gpus["max_w"]), path
        node = env.filter((pl.col("path") == path) & (pl.col("scope") == "node")).row(0, named=True)
        assert node["p50_w"] == node["p95_w"] == 2 * level, path
        assert 2 * level <= node["max_w"] <= 2 * (level + QUANTUM_W), path
    step = env.filter((pl.col("path") == "step") & (pl.col("scope") == "gpu"))
    top = max(levels(CFG).values())
    assert all(top <= m <= top + QUANTUM_W for m in step["max_w"])


def test_energy_shares_equal_the_ground_truth(run):
    result, env, truth, _ = run
    total = result.summary.energy.total_energy_j
    assert total == pytest.approx(truth["total_energy_j"], abs=CFG.ranks * 1e-3)
    for row in env.iter_rows(named=True):
        ranges = [r for r in truth["driver_phases"] if r["path"] == row["path"]]
        gpus = range(CFG.ranks) if row["scope"] == "node" else [int(row["device"][-1])]
        expected_j = sum(r["per_device_j"][g] for r in ranges for g in gpus)
        tolerance_j = len(ranges) * len(gpus) * 1e-3
        assert row["energy_j"] == pytest.approx(expected_j, abs=tolerance_j)
        share = 100 * expected_j / truth["total_energy_j"]
        share_tolerance = 100 * (tolerance_j + expected_j * CFG.ranks * 1e-3 / total) / total
        assert row["energy_share_pct"] == pytest.approx(share, abs=share_tolerance)
    node_step = env.filter((pl.col("path") == "step") & (pl.col("scope") == "node")).row(
        0, named=True
    )
    attributed = result.summary.energy.attributed_energy_j  # every step phase lies in a step
    assert node_step["energy_share_pct"] == pytest.approx(100 * attributed / total, rel=1e-9)


def test_ramp_of_a_known_step_change(run):
    _, env, _, builder = run
    window = RAMP_READINGS * READ_NS
    power = builder.power

    def ramp(gpu: int, start: int) -> float:  # the model's exact second difference, W/ms
        e = power.cumulative_energy_j(gpu, np.array([start - window, start, start + window]))
        return float((e[2] - 2 * e[1] + e[0]) / (window / 1e9) / (window / 1e6))

    bound = 2e-3 / (window / 1e9) / (window / 1e6)  # 2 mJ of counter rounding over w²
    starts = [r.start for r in builder.driver if r.path == "step/update_actor"]
    for g in range(CFG.ranks):
        expected = [ramp(g, s) for s in starts]
        # idle before, the level from 100 µs in: (2/3 of the step) / w
        step_w = PHASE_POWER_W["update_actor"]
        assert expected == pytest.approx([step_w * 2 / 3 / (window / 1e6)] * len(starts))
        row = env.filter(
            (pl.col("path") == "step/update_actor") & (pl.col("device") == f"run:{g}")
        ).row(0, named=True)
        assert row["ramp_w_per_ms"] == pytest.approx(float(np.median(expected)), abs=bound)
        assert row["ramp_max_w_per_ms"] == pytest.approx(max(expected), abs=bound)


def test_without_a_counter_power_readings_are_used(run):
    result, _, _, _ = run
    samples = result.power_samples.with_columns(pl.lit(None, dtype=pl.Int64).alias("energy_mj"))
    hosts = {d.device: d.host for d in result.summary.devices}
    env = envelope(result.phases, result.phase_devices, samples, hosts, 1.0)
    assert set(env["power_from"]) == {READING}
    for path, level in levels(CFG).items():  # the model's instantaneous power, read exactly
        gpus = env.filter((pl.col("path") == path) & (pl.col("scope") == "gpu"))
        assert gpus.select("p50_w", "p95_w", "max_w").to_numpy().tolist() == [[level] * 3] * 2


# --- hand-built series: exact numbers, counter fits, short phases --------------------------------

MS = 1_000_000


def _samples(t: np.ndarray, energy_mj: np.ndarray, device: str = "g0") -> pl.DataFrame:
    return pl.DataFrame(
        {"device": device, "t_ns": t, "power_w": 0.0, "energy_mj": energy_mj},
        schema={
            "device": pl.String,
            "t_ns": pl.Int64,
            "power_w": pl.Float64,
            "energy_mj": pl.Int64,
        },
    )


def _phases(*spans: tuple[str, int, int]) -> pl.DataFrame:
    return pl.DataFrame(
        [(p, s, e, "window", 1) for p, s, e in spans],
        schema=["path", "start_ns", "end_ns", "attribution", "step"],
        orient="row",
    )


def test_step_change_gives_exact_levels_and_ramp():
    t = np.arange(0, 2001 * MS, 10 * MS)  # 10 ms reads; 100 W, then 500 W from 1 s
    energy = np.where(t <= 1000 * MS, t // MS * 100, 100_000 + (t // MS - 1000) * 500)
    env = envelope(
        _phases(
            ("busy", 1000 * MS, 1500 * MS),
            ("short", 1500 * MS, 1505 * MS),
            ("quiet", 500 * MS, 1004 * MS),  # 4 ms into the first 500 W reading
        ),
        pl.DataFrame(schema={"path": pl.String, "device": pl.String, "step": pl.Int64}),
        _samples(t, energy),
        {"g0": "h"},
        None,
    )
    busy = env.filter((pl.col("path") == "busy") & (pl.col("scope") == "gpu")).row(0, named=True)
    assert (busy["p50_w"], busy["p95_w"], busy["max_w"]) == (500.0, 500.0, 500.0)
    assert busy["ramp_w_per_ms"] == pytest.approx((500 - 100) / 30, rel=1e-12)  # over 3 × 10 ms
    assert busy["n_samples"] == 51 and not busy["few_samples"]
    quiet = env.filter((pl.col("path") == "quiet") & (pl.col("scope") == "gpu")).row(0, named=True)
    # the 500 W reading (1000, 1010] ms lies mostly outside: it is busy's, not quiet's, maximum
    assert (quiet["p50_w"], quiet["p95_w"], quiet["max_w"]) == (100.0, 100.0, 100.0)
    short = env.filter((pl.col("path") == "short") & (pl.col("scope") == "gpu")).row(0, named=True)
    assert short["n_samples"] == 1 and short["few_samples"]  # flagged, not dropped
    assert short["p50_w"] == 500.0
    assert short["energy_j"] is None and short["energy_share_pct"] is None


def test_counter_slower_than_reads_is_fitted_to_its_update_clock():
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(22 * MS, 29 * MS, size=800))  # H200-like: reads every ~25 ms
    updates = 7 * MS + np.arange(0, t[-1] // (100 * MS) + 2) * 100 * MS  # counter: every 100 ms
    power = np.where(updates < t[400], 120.0, 690.0)
    counter = np.cumsum(power * 100)  # mJ gained by each 100 ms update
    seen = np.searchsorted(updates, t, side="right") - 1  # last update at or before each read
    samples = _samples(t, np.rint(counter[seen]).astype(np.int64))
    series = device_series(samples)["g0"]
    assert series.source == COUNTER
    assert series.interval_ns == pytest.approx(100 * MS, rel=1e-4)
    steady = np.abs(np.diff(series.power, prepend=series.power[0])) == 0
    assert np.all(np.isin(np.round(series.power[steady], 1), [120.0, 690.0]))
    # the first reads showing each update would put Δt off by up to a read: ±25% in power
    changed = np.flatnonzero(np.diff(samples["energy_mj"].to_numpy()) != 0) + 1
    naive = np.diff(samples["energy_mj"].to_numpy()[changed]) * 1e6 / np.diff(t[changed])
    assert naive[:300].max() / naive[:300].min() > 1.2


def test_gpus_of_two_hosts_and_a_faulty_one():
    t = np.arange(0, 101 * MS, 10 * MS)
    good = [_samples(t, t // MS * w, d) for d, w in (("a0", 100), ("a1", 200), ("b0", 300))]
    broken = _samples(np.array([0, 10 * MS, 10 * MS, 20 * MS]), np.array([0, 5, 9, 20]), "b1")
    env = envelope(
        _phases(("x", 20 * MS, 80 * MS)),
        pl.DataFrame(schema={"path": pl.String, "device": pl.String, "step": pl.Int64}),
        pl.concat([*good, broken]),
        {"a0": "A", "a1": "A", "b0": "B", "b1": "B"},
        None,
    )
    rows = {(r["scope"], r["device"] or r["host"]): r for r in env.iter_rows(named=True)}
    assert rows["node", "A"]["p50_w"] == 300.0 and rows["node", "A"]["n_gpus"] == 2
    assert rows["node", "B"]["p50_w"] == 300.0 and rows["node", "B"]["n_gpus"] == 1
    assert rows["gpu", "b1"]["p50_w"] is None and rows["gpu", "b1"]["power_from"] is None


# --- the bundled sample through the CLI -----------------------------------------------------------


def test_sample_run_writes_power_envelope_csv(tmp_path):
    out = tmp_path / "out"
    runner = CliRunner()
    done = runner.invoke(
        app, ["analyze", str(SAMPLES / "grpo_synthetic.sqlite"), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    table = pl.read_csv(out / "power_envelope.csv")
    sample = SynthConfig()  # the bundled sample's configuration
    assert table.height == 3 * 8  # 8 paths × (2 GPUs + 1 node)
    for path, level in levels(sample).items():
        rows = table.filter(pl.col("path") == path).sort("scope", "device")
        assert rows["scope"].to_list() == ["gpu", "gpu", "node"]
        assert rows["device"].to_list() == ["grpo_synthetic:0", "grpo_synthetic:1", None]
        assert rows["p50_w"].to_list() == [level, level, 2 * level]
        assert rows["p95_w"].to_list() == [level, level, 2 * level]
        assert rows["n_ranges"].to_list() == [3, 3, 3]
    summary = json.loads((out / "summary.json").read_text())
    node_step = table.filter((pl.col("path") == "step") & (pl.col("scope") == "node"))
    share = 100 * summary["attributed_energy_j"] / summary["total_energy_j"]
    assert node_step["energy_share_pct"].item() == pytest.approx(share, abs=5e-4)  # 3 decimals
    for name in ("power_envelope.csv", "figures/power_envelope.png", "figures/power_envelope.svg"):
        assert name in json.loads((out / MANIFEST).read_text())["files"]
    # a report into the analysis folder keeps the table and redraws the figure into the report
    report = runner.invoke(app, ["report", str(out), "--out", str(out)])
    assert report.exit_code == 0, report.output
    assert (out / "power_envelope.csv").exists()
    assert "![power_envelope](figures/power_envelope.png)" in (out / "report.md").read_text()


def test_union_of_sorted_is_numpys_unique_of_the_concatenation():
    from nvtx_phases.analysis.intervals import merged_instants as _union_of_sorted

    a = np.array([1, 3, 5, 7, 9], dtype=np.int64)
    b = np.array([2, 3, 4, 9, 11], dtype=np.int64)
    c = np.array([], dtype=np.int64)
    merged = _union_of_sorted([a, b, c, [5, 12]])
    assert merged.tolist() == [1, 2, 3, 4, 5, 7, 9, 11, 12]
    assert merged.dtype == np.int64
    assert _union_of_sorted([c]).tolist() == []
