"""``figures/NAME.csv``: each figure's numbers, against brute force over phases.csv or the raw export.

Every expected value here is computed in the test, in plain Python, from ``phases.csv`` (or the
power samples, the length records, or the export itself via ``sqlite3``), never from the code
that drew the figure. Inputs: the bundled sample (with power and lengths), a Ray-style capture
(driver + 4 worker processes, one export each) and a real CPU-only export from ../shared.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.render.outputs.files import MANIFEST
from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
CAP = 4096


def _cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "out"
    _cli("report", str(SAMPLE), "--out", str(out), "--cap", str(CAP))
    return out


@pytest.fixture(scope="module")
def ray(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ray")
    generate_ray(folder / "capture", RayConfig(steps=3, seed=7))  # as `synth --ray`
    out = folder / "out"
    _cli("analyze", str(folder / "capture"), "--out", str(out), "-q")
    return folder / "capture" / "driver.sqlite", out


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> tuple[Path, Path]:
    export = shared_trace("local_cpu_nvtx_nsys2022.4.sqlite")
    out = tmp_path_factory.mktemp("real") / "out"
    _cli("analyze", str(export), "--out", str(out), "-q")
    return export, out


# --- brute force over phases.csv ------------------------------------------------------------------


def _num(text: str) -> float | None:
    return None if text == "" else float(text)


def _phase_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "phases.csv", newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r["step"] != ""]


def _steps(out: Path) -> tuple[dict[int, dict], dict[tuple[int, str], dict]]:
    """Per step its ``step`` rows summed (wall, ranges, energy), per (step, phase) its ``step/X`` rows."""
    steps: dict[int, dict] = defaultdict(lambda: {"wall": 0, "n": 0, "energy": 0.0})
    phases: dict[tuple[int, str], dict] = defaultdict(
        lambda: {"wall": 0, "energy": 0.0, "start": float("inf")}
    )
    for r in _phase_rows(out):
        step = int(r["step"])
        energy = _num(r["energy_j"])
        if r["path"] == "step":
            target = steps[step]
            target["n"] += int(r["n_ranges"])
        elif r["path"].startswith("step/") and r["path"].count("/") == 1:
            target = phases[(step, r["canonical"])]
            target["start"] = min(target["start"], int(r["start_ns"]))
            for k in ("gpu_busy_ns", "idle_ns", "nccl_ns", "memcpy_ns", "memcpy_bytes"):
                target[k] = target.get(k, 0) + int(r[k])
        else:
            continue
        target["wall"] += int(r["wall_ns"])
        target["energy"] = (
            None if energy is None or target["energy"] is None else target["energy"] + energy
        )
    return dict(steps), dict(phases)


def _order(phases: dict[tuple[int, str], dict]) -> list[str]:
    first: dict[str, float] = {}
    for (_, name), p in phases.items():
        first[name] = min(first.get(name, float("inf")), p["start"])
    return sorted(first, key=lambda n: (first[n], n))


def _csv(out: Path, stem: str) -> pl.DataFrame:
    text = {"bar": pl.String, "label": pl.String, "device": pl.String, "host": pl.String}
    return pl.read_csv(
        out / "figures" / f"{stem}.csv", schema_overrides=text, infer_schema_length=None
    )


def _percentiles(values: list[float]) -> list[float]:
    return [float(v) for v in np.percentile(values, [10, 50, 90])]


def _expected_shares(out: Path) -> dict[str, dict[str, list[float] | int]]:
    steps, phases = _steps(out)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"time": [], "energy": []})
    for (step, name), p in phases.items():
        per[name]["time"].append(100 * p["wall"] / steps[step]["wall"])
        if p["energy"] is not None and steps[step]["energy"]:
            per[name]["energy"].append(100 * p["energy"] / steps[step]["energy"])
    return {
        name: {
            "n_steps": len(v["time"]),
            "time": _percentiles(v["time"]),
            "energy": _percentiles(v["energy"]) if v["energy"] else [None] * 3,
        }
        for name, v in per.items()
    }


def _check_phase_share(out: Path) -> None:
    data = _csv(out, "phase_share")
    expected = _expected_shares(out)
    _, phases = _steps(out)
    assert data["phase"].to_list() == _order(phases)
    for row in data.iter_rows(named=True):
        want = expected[row["phase"]]
        assert row["n_steps"] == want["n_steps"]
        got_time = [row[f"time_share_{q}_pct"] for q in ("p10", "median", "p90")]
        assert got_time == pytest.approx(want["time"], rel=1e-12)
        got_energy = [row[f"energy_share_{q}_pct"] for q in ("p10", "median", "p90")]
        if want["energy"][0] is None:
            assert got_energy == [None] * 3
        else:
            assert got_energy == pytest.approx(want["energy"], rel=1e-9)


def _check_phase_time_per_step(out: Path) -> None:
    data = _csv(out, "phase_time_per_step")
    steps, phases = _steps(out)
    order = [*_order(phases), "other (no phase)"]
    expected = []
    for step in sorted(steps):
        segments = {
            n: p["wall"] / steps[step]["n"] / 1e6 for (s, n), p in phases.items() if s == step
        }
        other = steps[step]["wall"] / steps[step]["n"] / 1e6 - sum(segments.values())
        if other > 1e-9:
            segments["other (no phase)"] = other
        bottom = 0.0
        for name in sorted(segments, key=order.index):
            expected.append(
                (str(step), step, step, 1, order.index(name), name, segments[name], bottom)
            )
            bottom += segments[name]
    got = data.rows()
    assert data.columns == [
        "bar",
        "first_step",
        "last_step",
        "n_steps",
        "position",
        "phase",
        "wall_ms",
        "bottom_ms",
    ]
    assert [r[:6] for r in got] == [e[:6] for e in expected]
    assert [r[6:] for r in got] == [pytest.approx(e[6:], rel=1e-12, abs=1e-9) for e in expected]


def _check_sums(out: Path, stem: str, columns: dict[str, str]) -> None:
    data = _csv(out, stem)
    _, phases = _steps(out)
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (_, name), p in phases.items():
        for column, source in columns.items():
            totals[name][column] += p[source]
    assert data["phase"].to_list() == _order(phases)
    for row in data.iter_rows(named=True):
        assert {c: row[c] for c in columns} == dict(totals[row["phase"]])


# --- the bundled sample (power, lengths) -----------------------------------------------------------


def test_sample_phase_time_per_step(sample):
    _check_phase_time_per_step(sample)


def test_sample_phase_share_is_of_the_step_range(sample):
    _check_phase_share(sample)


def test_sample_busy_idle_and_data_movement_are_sums_over_steps_and_gpus(sample):
    _check_sums(
        sample, "busy_idle_per_phase", {"gpu_busy_ns": "gpu_busy_ns", "gpu_idle_ns": "idle_ns"}
    )
    _check_sums(
        sample,
        "data_movement_per_phase",
        {"nccl_ns": "nccl_ns", "memcpy_ns": "memcpy_ns", "memcpy_bytes": "memcpy_bytes"},
    )


def test_sample_energy_per_phase_device(sample):
    devices = pl.read_parquet(sample / "phase_devices.parquet")
    expected: dict[tuple[str, str], float] = defaultdict(float)
    for r in devices.iter_rows(named=True):
        if (
            r["path"].startswith("step/")
            and r["path"].count("/") == 1
            and r["energy_j"] is not None
        ):
            expected[(r["path"], r["device"])] += r["energy_j"]
    data = _csv(sample, "energy_per_phase_device")
    got = {(r["path"], r["device"]): r["energy_j"] for r in data.iter_rows(named=True)}
    assert got == pytest.approx(dict(expected), rel=1e-12)
    assert data["phase"].to_list() == [p.split("/")[1] for p in data["path"]]


def test_sample_power_timeline_draws_every_sample_and_the_driver_phases(sample):
    samples = pl.read_parquet(sample / "power_samples.parquet")
    data = _csv(sample, "power_timeline")
    lines = data.filter(pl.col("kind") == "gpu")
    expected = sorted((r["device"], r["t_ns"], r["power_w"]) for r in samples.iter_rows(named=True))
    assert sorted(lines.select("device", "t_ns", "power_w").rows()) == expected
    ribbon = data.filter(pl.col("kind") == "phase").select("label", "step", "start_ns", "end_ns")
    driver = [
        (r["canonical"], int(r["step"]), int(r["start_ns"]), int(r["end_ns"]))
        for r in _phase_rows(sample)
        if r["attribution"] == "window" and r["path"].count("/") == 1
    ]
    assert sorted(ribbon.rows()) == sorted(driver)


def test_sample_power_detail_draws_each_steps_samples_and_one_either_side(sample):
    samples = pl.read_parquet(sample / "power_samples.parquet")
    steps = {
        int(r["step"]): (int(r["start_ns"]), int(r["end_ns"]))
        for r in _phase_rows(sample)
        if r["path"] == "step"
    }
    data = _csv(sample, "power_timeline_detail")
    lines = data.filter(pl.col("kind") == "gpu")
    assert set(lines["panel_step"]) == {2, 3}  # the longest and the median-duration step
    for step in (2, 3):
        start, end = steps[step]
        expected = []
        for (device,), rows in samples.partition_by("device", as_dict=True).items():
            t = sorted(rows["t_ns"].to_list())
            inside = [x for x in t if start <= x <= end]
            before, after = [x for x in t if x < start][-1:], [x for x in t if x > end][:1]
            expected += [(device, x) for x in before + inside + after]
        got = lines.filter(pl.col("panel_step") == step)
        assert sorted(got.select("device", "t_ns").rows()) == sorted(expected)
        assert got["time_in_step_ms"].to_list() == pytest.approx(
            [(t - start) / 1e6 for t in got["t_ns"]]
        )


def test_sample_power_envelope_draws_the_envelope_table(sample):
    table = pl.read_csv(sample / "power_envelope.csv")
    data = _csv(sample, "power_envelope")
    watts = ("p50_w", "p95_w", "max_w")
    gpu = table.filter(pl.col("scope") == "gpu").select("path", "device", *watts)
    assert sorted(
        data.filter(pl.col("panel") == "gpu").select("path", "device", *watts).rows()
    ) == sorted(gpu.rows())
    extra = ("energy_share_pct", "ramp_w_per_ms", "ramp_max_w_per_ms")
    node = table.filter(pl.col("scope") == "node").select("path", "host", *watts, *extra)
    got = data.filter(pl.col("panel") == "node").select("path", "host", *watts, *extra)
    # the envelope table is written to 3 decimals; the figure's data at full precision
    for a, b in zip(sorted(got.rows()), sorted(node.rows()), strict=True):
        assert a[:2] == b[:2] and a[2:] == pytest.approx(b[2:], abs=5e-4)


def _responses() -> dict[int, list[int]]:
    lengths: dict[int, list[int]] = defaultdict(list)
    for file in sorted((SAMPLES / "grpo_synthetic_lengths").glob("*.jsonl")):
        for line in file.read_text().splitlines():
            record = json.loads(line)
            lengths[record["step"]] += record["output"]
    return dict(lengths)


def test_sample_length_cdf_is_each_steps_sorted_lengths(sample):
    data = _csv(sample, "length_cdf")
    responses = _responses()
    curves = data.filter(pl.col("kind") == "cdf")
    assert sorted(set(curves["step"])) == sorted(responses)  # 3 steps: all shown
    for step, lengths in responses.items():
        rows = curves.filter(pl.col("step") == step)
        assert rows["length_tokens"].to_list() == sorted(lengths)
        n = len(lengths)
        assert rows["fraction_at_most"].to_list() == pytest.approx([(i + 1) / n for i in range(n)])
    assert data.filter(pl.col("kind") == "cap")["length_tokens"].to_list() == [CAP]


def test_sample_length_heatmap_cells_are_shares_of_each_steps_responses(sample):
    data = _csv(sample, "length_heatmap")
    cells = data.filter(pl.col("kind") == "cell")
    for step, lengths in _responses().items():
        rows = cells.filter(pl.col("first_step") == step)
        assert set(rows["n_responses"]) == {len(lengths)}
        for low, high, share in rows.select(
            "length_low_tokens", "length_high_tokens", "share_of_responses"
        ).rows():
            last = high == cells["length_high_tokens"].max()
            inside = [x for x in lengths if low <= x < high or (last and x == high)]
            assert share == pytest.approx(len(inside) / len(lengths))
        assert sum(rows["share_of_responses"]) == pytest.approx(1.0)
    assert data.filter(pl.col("kind") == "cap")["length_low_tokens"].to_list() == [CAP]


def test_sample_straggler_timeline(sample):
    gen: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for r in _phase_rows(sample):
        if r["canonical"] == "generate_sequences":
            gen[int(r["step"])].append((int(r["pid"]), int(r["start_ns"]), int(r["end_ns"])))
    data = _csv(sample, "straggler_timeline")
    tails = data.filter(pl.col("kind") == "idle_tail")
    per_step = data.filter(pl.col("kind") == "generation")
    for step, ranks in gen.items():
        last = max(end for _, _, end in ranks)
        got = dict(tails.filter(pl.col("step") == step).select("pid", "idle_tail_ms").rows())
        assert got == pytest.approx({pid: (last - end) / 1e6 for pid, _, end in ranks})
        walls = [(end - start) / 1e6 for _, start, end in ranks]
        row = per_step.filter(pl.col("step") == step).row(0, named=True)
        assert (row["gen_slowest_ms"], row["gen_median_ms"]) == pytest.approx(
            (max(walls), float(np.median(walls)))
        )


def test_every_figure_has_its_csv_and_the_manifest_lists_them(sample):
    pngs = sorted(p.stem for p in (sample / "figures").glob("*.png"))
    csvs = sorted(p.stem for p in (sample / "figures").glob("*.csv"))
    assert pngs == csvs and len(pngs) == 11
    listed = set(json.loads((sample / MANIFEST).read_text())["files"])
    assert {f"figures/{stem}.csv" for stem in csvs} <= listed


# --- the raw export: a step's share straight from its NVTX ranges ----------------------------------


def _raw_shares(export: Path, phase: str) -> list[float]:
    """Per ``step`` range, ``phase``'s wall over the step's, ranges on the same thread (SQL only)."""
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    ranges = con.execute(
        "SELECT COALESCE(e.text, s.value), e.globalTid, e.start, e.end FROM NVTX_EVENTS e "
        "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL"
    ).fetchall()
    con.close()
    steps = [r for r in ranges if r[0] == "step"]
    shares = []
    for _, tid, start, end in steps:
        inside = [
            r[3] - r[2]
            for r in ranges
            if r[0] == phase and r[1] == tid and start <= r[2] and r[3] <= end
        ]
        shares.append(100 * sum(inside) / (end - start))
    return shares


def test_ray_capture_gen_share_is_gen_over_the_step(ray):
    driver, out = ray
    _check_phase_share(out)
    row = _csv(out, "phase_share").filter(pl.col("phase") == "gen").row(0, named=True)
    raw = _raw_shares(driver, "gen")
    assert len(raw) == 3
    assert row["time_share_median_pct"] == pytest.approx(float(np.median(raw)), rel=1e-12)
    # the old figure divided by the sum of the phases: that is larger than the step's share
    _, phases = _steps(out)
    over_phases = [
        100 * p["wall"] / sum(q["wall"] for (s, _), q in phases.items() if s == step)
        for (step, name), p in phases.items()
        if name == "gen"
    ]
    assert float(np.median(over_phases)) > row["time_share_median_pct"] + 0.5


def test_ray_capture_other_figures(ray):
    _, out = ray
    _check_phase_time_per_step(out)
    _check_sums(
        out, "busy_idle_per_phase", {"gpu_busy_ns": "gpu_busy_ns", "gpu_idle_ns": "idle_ns"}
    )
    files = sorted(p.name for p in (out / "figures").iterdir())
    assert [f for f in files if f.endswith(".csv")] == [
        f.replace(".png", ".csv") for f in files if f.endswith(".png")
    ]


def test_sample_gen_share_equals_the_raw_export(sample):
    row = _csv(sample, "phase_share").filter(pl.col("phase") == "gen").row(0, named=True)
    raw = _raw_shares(SAMPLE, "gen")
    assert row["time_share_median_pct"] == pytest.approx(float(np.median(raw)), rel=1e-12)
    assert [row[f"time_share_{q}_pct"] for q in ("p10", "p90")] == pytest.approx(
        [float(v) for v in np.percentile(raw, [10, 90])], rel=1e-12
    )


# --- a real export (CPU only: wall times, no power) ------------------------------------------------


def test_real_export_step_figures(real):
    export, out = real
    _check_phase_time_per_step(out)
    _check_phase_share(out)
    data = _csv(out, "phase_share")
    for phase in ("gen", "update_actor"):
        raw = _raw_shares(export, phase)
        row = data.filter(pl.col("phase") == phase).row(0, named=True)
        assert row["time_share_median_pct"] == pytest.approx(float(np.median(raw)), rel=1e-12)
    assert data["energy_share_median_pct"].null_count() == data.height  # no power: no energy share
    assert sorted(p.name for p in (out / "figures").iterdir()) == [
        f"{stem}.{ext}"
        for stem in ("phase_share", "phase_time_per_step")
        for ext in ("csv", "png", "svg")
    ]


# --- a comparison's figures ------------------------------------------------------------------------


def test_compare_wall_figure_data_is_each_runs_percentiles_over_steps(sample, ray, tmp_path):
    _, ray_out = ray
    out = tmp_path / "compare"
    _cli("compare", str(sample), str(ray_out), "-l", "sample", "-l", "ray", "-o", str(out))
    data = _csv(out, "compare_wall_ms")
    driver = data.filter(pl.col("panel") == "driver's phases (window)")
    assert driver.height >= 12
    for run, folder in (("sample", sample), ("ray", ray_out)):
        walls: dict[str, list[float]] = defaultdict(list)
        for r in _phase_rows(folder):
            if r["attribution"] == "window" and r["path"].startswith("step/"):
                walls[r["path"]].append(int(r["wall_ns"]) / 1e6)
        for row in driver.filter(pl.col("run") == run).iter_rows(named=True):
            got = [row["p10_ms"], row["median_ms"], row["p90_ms"]]
            assert got == pytest.approx(_percentiles(walls[row["path"]]), rel=1e-12)
    pngs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert pngs == sorted(p.stem for p in (out / "figures").glob("*.csv"))
