"""The prepared GPU check: its dry run, its helpers on exact numbers, and its GPU path on a fake GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import polars as pl
import pytest

from checks import gpu_check as gc

ROOT = Path(__file__).resolve().parents[1]
UUID = "cf6b97c0-bf53-a39e-febd-9532190b5766"
CFG = gc.Config(out=Path("."))


# ---------------------------------------------------------------- dry run, as CI runs it


def test_dry_run_writes_ranges_tables_and_says_no_gpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "dry"
    done = subprocess.run(
        [sys.executable, "-m", "checks.gpu_check", "--out", str(out), "--dry", "--steps", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert gc.DRY_NOTICE in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(gc.DRY_NOTICE)
    for name in ("gpu_check.json", "gpu_check.md", "ranges.jsonl", "power_synthetic.parquet"):
        assert (out / name).is_file(), name
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["mode"] == "dry" and report["passed"] is True
    rows = [(r["step"], r["phase"]) for r in report["phases"]]
    assert rows == [(s, p) for s in (1, 2) for p in ("idle", "gen", "update_actor")]
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["names, paths and step indices"] == "PASS"
    assert statuses["each phase nested in its step"] == "PASS"
    assert statuses["energy on the GPU"] == "SKIP"
    ranges = gc.read_ranges(out / "ranges.jsonl")
    assert ranges.height == 1 + 2 + 2 * 3  # warmup, steps, phases
    assert gc.DRY_NOTICE in (out / "gpu_check.md").read_text()


# ---------------------------------------------------------------- helpers, exact numbers


def _samples(t_ns, power_w, energy_mj) -> pl.DataFrame:
    n = len(t_ns)
    return pl.DataFrame(
        {"device": ["g"] * n, "t_ns": t_ns, "power_w": power_w, "energy_mj": energy_mj},
        schema={"device": pl.String, "t_ns": pl.Int64, "power_w": pl.Float64, "energy_mj": pl.Int64},
    )


def test_power_step_edge_is_found_at_the_exact_time():
    half_step = [10_000_000 + i * 20_000_000 for i in range(100)]  # 10, 30, …, 1990 ms
    series = ([float(t) for t in half_step], [100.0 if t < 1e9 else 300.0 for t in half_step])
    assert gc.edge_time(series, 200.0, True, 0.0, 2e9) == 1_000_000_000.0
    on_grid = [i * 20_000_000 for i in range(100)]  # 1.000 s itself reads 300 W
    series = ([float(t) for t in on_grid], [100.0 if t < 1e9 else 300.0 for t in on_grid])
    assert gc.edge_time(series, 200.0, True, 0.0, 2e9) == 990_000_000.0
    falling = (series[0], [400.0 - p for p in series[1]])  # 300 → 100 W
    assert gc.edge_time(falling, 200.0, False, 0.0, 2e9) == 990_000_000.0
    assert gc.edge_time(series, 200.0, False, 0.0, 2e9) is None


def test_boundary_lag_of_a_step_and_of_a_one_second_average():
    before = {"start_ns": 0, "end_ns": 1_000_000_000, "phase": "idle", "step": 1}
    after = {"start_ns": 1_000_000_000, "end_ns": 3_000_000_000, "phase": "gen", "step": 1}
    t = [i * 20_000_000 for i in range(151)]  # 0 … 3 s
    step = ([float(v) for v in t], [100.0 if v < 1e9 else 300.0 for v in t])
    assert gc.boundary_lag_ms(step, before, after, 30.0) == -10.0  # the 1.000 s sample reads 300
    # a 1 s moving average of that step: a ramp from 1 s to 2 s, halfway at 1.5 s → +500 ms
    ramp = [100.0 + 200.0 * min(max(v - 1e9, 0.0), 1e9) / 1e9 for v in t]
    assert gc.boundary_lag_ms((step[0], ramp), before, after, 30.0) == pytest.approx(500.0, abs=1e-6)
    assert gc.boundary_lag_ms(step, before, after, 250.0) is None  # levels 200 W apart only
    windows = pl.DataFrame(
        [{"id": 0, "device": "g", **before}, {"id": 1, "device": "g", **after}]
    )
    rows = gc.boundary_lags(windows, {"counter": step, "sampled": (step[0], ramp)}, 30.0)
    assert rows == [
        {"step": 1, "boundary": "idle→gen", "t_s": 1.0, "lag_ms_counter": -10.0, "lag_ms_sampled": 500.0}
    ]
    assert gc.lag_summary(rows, "sampled") == {
        "boundaries": 1,
        "measured": 1,
        "median_ms": 500.0,
        "max_abs_ms": 500.0,
    }


def test_counter_energy_and_counter_power_from_a_linear_counter():
    t = [i * 20_000_000 for i in range(101)]  # 0 … 2 s
    frame = _samples(t, [250.0] * len(t), [250 * v // 1_000_000 for v in t])  # 250 W
    assert gc.counter_energy_between(frame, "g", 505_000_000, 1_495_000_000) == pytest.approx(
        247.5, abs=1e-9
    )
    assert gc.counter_energy_between(frame, "g", 0, 2_000_000_000) == 500.0
    times, power = gc.counter_power([float(v) for v in t], [250 * v / 1e6 for v in t], 100e6)
    assert power == [pytest.approx(250.0)] * (len(t) - 5)  # k = 5 samples of 20 ms
    assert times[0] == 50_000_000.0  # midpoint of 0 and 100 ms


def test_phase_table_integrated_vs_counter_on_known_power():
    t = [i * 10_000_000 for i in range(301)]  # 0 … 3 s every 10 ms
    power = [100.0 if v < 1e9 else 300.0 if v < 2e9 else 500.0 for v in t]
    energy, cum = [], 0.0
    for i, v in enumerate(t):  # exact counter of the piecewise-constant power (mJ)
        cum += 0.0 if i == 0 else power[i - 1] * (v - t[i - 1]) / 1e6
        energy.append(round(cum))
    frame = _samples(t, power, energy)
    windows = pl.DataFrame(
        {
            "id": [0, 1, 2],
            "device": ["g"] * 3,
            "step": [1, 1, 1],
            "phase": ["idle", "gen", "update_actor"],
            "start_ns": [0, 1_000_000_000, 2_000_000_000],
            "end_ns": [1_000_000_000, 2_000_000_000, 3_000_000_000],
        }
    )
    table = gc.phase_table(frame, windows)
    assert table["energy_counter_j"].to_list() == [100.0, 300.0, 500.0]
    # trapezoids: the 10 ms before each step up is averaged with the new level
    assert table["energy_integrated_j"].to_list() == pytest.approx([101.0, 302.0, 500.0])
    assert table["mean_power_counter_w"].to_list() == [100.0, 300.0, 500.0]
    run = gc.whole_run(frame, windows)
    assert run["energy_counter_j"] == 900.0 and run["energy_integrated_j"] == pytest.approx(903.0)
    checks = gc.check_energy(table, run, CFG)
    assert [c.status for c in checks] == ["PASS", "PASS"]
    assert gc.check_ordering(table).status == "PASS"
    swapped = table.with_columns(pl.col("mean_power_counter_w").reverse())
    bad = gc.check_ordering(swapped)
    assert bad.status == "FAIL" and "out of order in step(s) [1]" in bad.detail
    tight = gc.Config(out=Path("."), tol_phase=0.005)
    assert gc.check_energy(table, run, tight)[0].status == "FAIL"  # gen is 0.67% off


def test_lag_check_gates_on_the_counter_and_reports_sampled_power():
    rows = [{"lag_ms_counter": 3.0, "lag_ms_sampled": 480.0}, {"lag_ms_counter": -5.0, "lag_ms_sampled": 520.0}]
    gated, info = gc.check_lag(rows, CFG, gated="counter", informative="sampled")
    assert (gated.status, info.status) == ("PASS", "INFO")
    assert "max |lag| 5.0 ms" in gated.detail and "median +500.0 ms" in info.detail
    late = [{"lag_ms_counter": 150.0, "lag_ms_sampled": None}]
    gated, info = gc.check_lag(late, CFG, gated="counter", informative="sampled")
    assert (gated.status, info.status) == ("FAIL", "INFO")


def test_uuid_spellings_and_the_uuid_check():
    nvml = f"GPU-{UUID.upper()}"
    assert gc.normalize_gpu_uuid(nvml) == f"GPU-{UUID}"
    assert gc.normalize_gpu_uuid(UUID) == f"GPU-{UUID}"
    assert gc.normalize_gpu_uuid(UUID.replace("-", "")) == f"GPU-{UUID}"
    assert gc.normalize_gpu_uuid(types.SimpleNamespace(bytes=bytes.fromhex(UUID.replace("-", "")))) == f"GPU-{UUID}"
    assert gc.normalize_gpu_uuid("MIG-GPU-xyz") is None and gc.normalize_gpu_uuid(None) is None
    assert gc.check_uuid(f"GPU-{UUID}", gc.normalize_gpu_uuid(UUID)).status == "PASS"
    assert gc.check_uuid(f"GPU-{UUID}", None).status == "FAIL"


def test_sample_interval_stats_and_check():
    t = [i * 20_000_000 for i in range(20)] + [19 * 20_000_000 + 60_000_000]  # one 60 ms gap
    stats = gc.interval_stats(t, 0.02)
    assert stats == {"requested_ms": 20.0, "samples": 21, "median_ms": 20.0, "p95_ms": 20.0}
    assert gc.check_interval(stats, CFG).status == "PASS"
    slow = gc.interval_stats([i * 40_000_000 for i in range(10)], 0.02)
    assert gc.check_interval(slow, CFG).status == "FAIL"


def _ranges(pid: int) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"name": "step", "path": "step", "step": 1, "pid": pid, "start_mono_ns": 100, "end_mono_ns": 900, "start_wall_ns": 5_100, "dur_ns": 800},
            {"name": "gen", "path": "step/gen", "step": 1, "pid": pid, "start_mono_ns": 200, "end_mono_ns": 500, "start_wall_ns": 5_200, "dur_ns": 300},
        ],
        schema=gc.RANGE_SCHEMA,
    )  # fmt: skip


def test_clock_mapping_same_process_and_other_process():
    samples = pl.DataFrame({"pid": [7, 7], "mono_ns": [0, 10], "wall_ns": [1_000, 1_010]})
    mapped, info = gc.map_to_sampler_clock(_ranges(7), samples)
    assert info["same_clock"] and "same host clock" in info["method"]
    assert mapped["start_ns"].to_list() == [100, 200] and mapped["end_ns"].to_list() == [900, 500]
    mapped, info = gc.map_to_sampler_clock(_ranges(8), samples)  # wall − 1000 on the sampler
    assert not info["same_clock"]
    assert mapped["start_ns"].to_list() == [4_100, 4_200] and mapped["end_ns"].to_list() == [4_900, 4_500]
    assert info["wall_minus_mono_disagreement_us"] == 4.0  # (5000 − 1000) ns


def test_range_checks_catch_a_phase_outside_its_step():
    good = pl.concat(
        [_ranges(7), pl.DataFrame([{"name": "warmup", "path": "warmup", "pid": 7, "start_mono_ns": 0, "end_mono_ns": 50, "start_wall_ns": 0, "dur_ns": 50}], schema=gc.RANGE_SCHEMA)]
    )  # fmt: skip
    extra = [
        {"name": p, "path": f"step/{p}", "step": 1, "pid": 7, "start_mono_ns": 500, "end_mono_ns": 600, "start_wall_ns": 0, "dur_ns": 100}
        for p in ("idle", "update_actor")
    ]  # fmt: skip
    ranges = pl.concat([good, pl.DataFrame(extra, schema=gc.RANGE_SCHEMA)])
    assert [c.status for c in gc.check_ranges(ranges, 1)] == ["PASS", "PASS", "PASS"]
    moved = ranges.with_columns(
        pl.when(pl.col("name") == "gen").then(950).otherwise(pl.col("end_mono_ns")).alias("end_mono_ns")
    )
    nested = gc.check_ranges(moved, 1)[2]
    assert nested.status == "FAIL" and nested.detail == "2/3 inside"
    assert gc.check_ranges(ranges, 2)[1].status == "FAIL"  # expected 2 steps


def test_power_reading_classification():
    avg = [{"usage_w": 410.0, "instant_w": 620.0, "average_w": 400.0}]
    assert gc.classify_power_reading(avg).startswith("averaged")
    inst = [{"usage_w": 615.0, "instant_w": 620.0, "average_w": 400.0}]
    assert gc.classify_power_reading(inst).startswith("instantaneous")
    assert gc.classify_power_reading([{"usage_w": 1.0, "instant_w": None, "average_w": None}]).startswith("undetermined")


def test_synthetic_exact_checks_pass():
    assert [c.status for c in gc.synthetic_exact_checks()] == ["PASS"] * 3


# ---------------------------------------------------------------- the GPU path on a fake GPU


class FakeGpu:
    """Piecewise-constant power set by the test; exact energy counter; optionally delayed power."""

    def __init__(self, delay_ns: int = 0) -> None:
        self.delay_ns = delay_ns
        self.lock = threading.Lock()
        self.history = [(time.monotonic_ns(), 80.0)]  # (since, watts)
        self.energy_mj = 0.0

    def set(self, watts: float) -> None:
        with self.lock:
            now = time.monotonic_ns()
            since, level = self.history[-1]
            self.energy_mj += level * (now - since) / 1e6
            self.history.append((now, watts))

    def power_at(self, t_ns: int) -> float:
        with self.lock:
            return next(w for since, w in reversed(self.history) if since <= t_ns)

    def energy(self) -> int:
        with self.lock:
            since, level = self.history[-1]
            return int(self.energy_mj + level * (time.monotonic_ns() - since) / 1e6)

    def pynvml(self) -> types.ModuleType:
        nv = types.ModuleType("pynvml")
        now = time.monotonic_ns

        def fields(handle, ids):
            def value(fid):
                watts = self.power_at(now()) if fid == 186 else self.history[-2][1]
                return types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=int(watts * 1000)))

            return [value(f) for f in ids]

        nv.__dict__.update(
            NVMLError=type("NVMLError", (Exception,), {}),
            NVML_SUCCESS=0, NVML_CLOCK_SM=1, NVML_FI_DEV_POWER_AVERAGE=185, NVML_FI_DEV_POWER_INSTANT=186,
            nvmlInit=lambda: None, nvmlShutdown=lambda: None,
            nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
            nvmlDeviceGetUUID=lambda h: f"GPU-{UUID}".encode(),
            nvmlDeviceGetPowerUsage=lambda h: int(self.power_at(now() - self.delay_ns) * 1000),
            nvmlDeviceGetTotalEnergyConsumption=lambda h: self.energy(),
            nvmlDeviceGetClockInfo=lambda h, c: 1980,
            nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=100, memory=40),
            nvmlSystemGetDriverVersion=lambda: "999.99", nvmlSystemGetNVMLVersion=lambda: "99.999",
            nvmlDeviceGetName=lambda h: "Fake H200", nvmlDeviceGetPowerManagementLimit=lambda h: 700_000,
            nvmlDeviceGetFieldValues=fields,
        )  # fmt: skip
        return nv


class FakeTorch:
    """Real (CPU) torch, but CUDA 'available' with a device of a known UUID."""

    __version__ = "fake"
    version = types.SimpleNamespace(cuda="12.fake")

    def __init__(self, real) -> None:
        self._real = real
        props = types.SimpleNamespace(name="Fake H200", uuid=UUID)
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, synchronize=lambda: None, get_device_properties=lambda i: props
        )

    def __getattr__(self, name):
        return getattr(self._real, name)


def _fake_gpu_run(tmp_path, monkeypatch, gpu: FakeGpu, *extra: str) -> tuple[int, dict]:
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "pynvml", gpu.pynvml())
    light = gc.build_workload
    monkeypatch.setattr(gc, "build_workload", lambda t, dry: light(torch, dry=True))
    levels = {"idle": 100.0, "gen": 300.0, "update_actor": 500.0}
    run_phase = gc.run_phase

    def powered_phase(name, *args, **kwargs):
        gpu.set(levels[name])
        try:
            run_phase(name, *args, **kwargs)
        finally:
            gpu.set(150.0)

    monkeypatch.setattr(gc, "run_phase", powered_phase)
    out = tmp_path / "gpu"
    argv = ["--out", str(out), "--steps", "2", "--phase-s", "0.3", "--warmup-s", "0.1"]
    argv += ["--interval-s", "0.01", "--counter-span-ms", "50", "--interval-median-max", "3"]
    argv += ["--interval-p95-max", "20", *extra]
    rc = gc.main(argv, torch=FakeTorch(torch))
    for name in ("gpu_check.json", "gpu_check.md", "ranges.jsonl", "power.parquet"):
        assert (out / name).is_file(), name
    return rc, json.loads((out / "gpu_check.json").read_text())


def test_gpu_path_on_a_fake_gpu_passes(tmp_path, monkeypatch, capsys):
    rc, report = _fake_gpu_run(tmp_path, monkeypatch, FakeGpu(), "--tol-phase", "0.25")
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert rc == 0, report["checks"]
    assert report["mode"] == "gpu" and report["passed"]
    assert status["sampler GPU UUID = torch GPU UUID"] == "PASS"
    assert status["power order update_actor > gen > idle"] == "PASS"
    assert status["clock alignment: edge lag of counter power"] == "PASS"
    assert report["clock"]["same_clock"] is True
    assert [(r["step"], r["phase"]) for r in report["phases"]] == [
        (s, p) for s in (1, 2) for p in ("idle", "gen", "update_actor")
    ]
    assert report["power_reading"]["power_usage_reading"].startswith("instantaneous")
    assert len(report["power_reading"]["probes"]) == 3
    assert "gpu_check PASS" in capsys.readouterr().out


def test_gpu_path_on_a_fake_gpu_with_delayed_power_fails_and_measures_the_delay(
    tmp_path, monkeypatch, capsys
):
    rc, report = _fake_gpu_run(tmp_path, monkeypatch, FakeGpu(delay_ns=100_000_000))
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert rc == 1
    assert status["energy per phase: integrated vs counter"] == "FAIL"
    assert status["clock alignment: edge lag of counter power"] == "PASS"
    assert report["lag_summary"]["sampled"]["median_ms"] == pytest.approx(100.0, abs=25.0)
    assert "gpu_check FAIL" in capsys.readouterr().out
