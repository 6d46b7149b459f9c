"""Power logs of nvidia-smi, dcgmi dmon and Zeus as power input (analysis/energy/power_logs.py).

The logs are written here in each tool's format, as the tools' sources print them:
- nvidia-smi ``--query-gpu=timestamp,index,uuid,power.draw --format=csv``: header
  ``timestamp, index, uuid, power.draw [W]``, rows ``2026/06/15 18:28:00.000, 0, GPU-…, 100.00 W``
  (the layout seen in public logs, e.g. the test fixtures of several inference benchmarks);
- ``dcgmi dmon -e 155,156``: ``#Entity POWER TOTEC`` / ``ID W mJ`` header pair, rows
  ``GPU 0  59.213  123456``, blanks ``N/A`` (NVIDIA/DCGM dcgmi/DeviceMonitor.cpp), each line
  stamped by moreutils ``ts '%Y-%m-%dT%H:%M:%.S%z'`` as public wrappers do;
- Zeus ``PowerMonitor(power_csv_path=…)`` (ml-energy/zeus ≤ 0.11 zeus/monitor/power.py): headerless
  ``f"{time()},{W},{W}"`` rows.

Energy is checked against a computation written here: the project defines a phase's energy from
power readings as the cumulative trapezoid at the readings, linearly interpolated between them at
the phase's ends (a counter: the counter interpolated the same way).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis import analyze
from nvtx_phases.analysis.energy import samples as samples_mod
from nvtx_phases.analysis.energy.power_logs import FORMATS, detect_format, log_samples
from nvtx_phases.analysis.energy.samples import align
from nvtx_phases.analysis.errors import InputError
from nvtxp_testkit import SAMPLES

TRACE = SAMPLES / "grpo_synthetic.sqlite"
ZERO = 1_790_000_000_000_000_000  # the sample's TARGET_INFO_SESSION_START_TIME.utcEpochNs
T = np.arange(0, 205_000_000, 1_000_000)  # a reading every ms over the whole capture
RNG = np.random.default_rng(7)
POWER = {
    g: np.round(100 + 200 * (np.sin(T / 7e6 + g) > 0) + RNG.normal(0, 5, T.size), 2) for g in (0, 1)
}
PLUS_TWO = dt.timezone(dt.timedelta(hours=2))


def local(ns: int, fmt: str = "%Y/%m/%d %H:%M:%S") -> str:
    """Trace time → the wall clock of a host at UTC+02:00, to the millisecond."""
    when = dt.datetime.fromtimestamp((ZERO + ns) // 10**9, PLUS_TWO)
    return when.strftime(fmt) + f".{(ZERO + ns) // 10**6 % 1000:03d}"


def expected(t: np.ndarray, cum_j: np.ndarray, start: int, end: int) -> float:
    return float(np.interp(end, t, cum_j) - np.interp(start, t, cum_j))


def trapezoid_cum(t: np.ndarray, watts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum((watts[1:] + watts[:-1]) / 2 * np.diff(t) / 1e9)])


def window_rows(result) -> list[dict]:
    return result.phases.filter(pl.col("attribution") == "window").to_dicts()


def check_energy(result, cum: dict[int, tuple[np.ndarray, np.ndarray]]) -> int:
    rows = window_rows(result)
    for row in rows:
        want = sum(expected(t, c, row["start_ns"], row["end_ns"]) for t, c in cum.values())
        assert row["energy_j"] == pytest.approx(want, rel=1e-9), row["path"]
    return len(rows)


@pytest.fixture(scope="module")
def smi_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("smi") / "smi.csv"
    lines = ["timestamp, index, uuid, power.draw [W]"]
    for i, t in enumerate(T):
        for g in (0, 1):
            value = "[N/A]" if (i == 50 and g == 1) else f"{POWER[g][i]:.2f} W"
            lines.append(f"{local(int(t))}, {g}, [N/A], {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_nvidia_smi_energy_per_phase_equals_the_trapezoid_of_its_rows(smi_log):
    with analyze([TRACE], power_files=[f"{smi_log},tz=+02:00"]) as result:
        keep = np.ones(T.size, bool)
        keep[50] = False  # GPU 1's [N/A] row is no reading, not 0 W
        cum = {
            0: (T, trapezoid_cum(T, POWER[0])),
            1: (T[keep], trapezoid_cum(T[keep], POWER[1][keep])),
        }
        assert check_energy(result, cum) == 24
        assert result.summary.energy.power_source == "nvidia-smi-power"
        (line,) = [w for w in result.warnings if w.startswith("power log smi.csv: nvidia-smi")]
    assert "nvidia-smi CSV (power.draw [W], timestamps: local time read in +02:00)" in line
    assert "no GPU UUIDs: matched by index" in line and "no energy counter" in line
    assert "1 row(s) without a reading ([N/A]) left out, not read as 0 W" in line


def test_local_time_without_a_zone_is_refused_in_one_line(smi_log):
    with pytest.raises(InputError, match=r"local time without a zone; .*tz=UTC"):
        analyze([TRACE], power_files=[smi_log])


def test_a_named_zone_reads_like_its_offset(smi_log):
    with (
        analyze([TRACE], power_files=[f"{smi_log},tz=Etc/GMT-2"]) as named,  # = UTC+02:00
        analyze([TRACE], power_files=[f"{smi_log},tz=+02:00"]) as offset,
    ):
        assert named.phases["energy_j"].to_list() == offset.phases["energy_j"].to_list()


def dmon_lines() -> list[str]:
    """``dcgmi dmon -e 155,156 -d 1`` (POWER W, TOTEC mJ), the header again every 7 readings."""
    header = ["#Entity           POWER             TOTEC", "ID                W                 mJ"]
    lines, counter = list(header), {0: 5_000_000, 1: 9_000_000}
    for i in range(T.size):
        if i and i % 7 == 0:
            lines += header
        for g in (0, 1):
            counter[g] += int(POWER[g][i])  # 1 ms at P W = P mJ
            power = "N/A" if i == 30 else f"{POWER[g][i]:.3f}"
            lines.append(f"GPU {g}             {power:<18}{counter[g]}")
    return lines


def stamped(lines: list[str]) -> list[str]:
    """Each line as ``ts '%Y-%m-%dT%H:%M:%.S%z'`` stamps it: a row at its reading's time."""
    readings = iter(np.repeat(T, 2))
    when = int(T[0])
    out = []
    for line in lines:
        if line.startswith("GPU"):
            when = int(next(readings))
        out.append(f"{local(when, '%Y-%m-%dT%H:%M:%S')}000+0200 {line}")
    return out


def test_dcgm_dmon_with_stamped_lines_uses_its_energy_counter(tmp_path):
    log = tmp_path / "dmon.log"
    log.write_text("\n".join(stamped(dmon_lines())) + "\n")
    with analyze([TRACE], power_files=[log]) as result:
        assert result.summary.energy.power_source == "dcgm-counter"
        cum = {}
        keep = np.arange(T.size) != 30  # the N/A power row is left out whole
        for g, first in ((0, 5_000_000), (1, 9_000_000)):
            totals = first + np.cumsum(POWER[g].astype(int))
            cum[g] = (T[keep], (totals[keep] - totals[keep][0]) / 1000.0)
        assert check_energy(result, cum) == 24
        (line,) = [
            w
            for w in result.warnings
            if w.startswith("power log dmon.log") and "outside the capture" not in w
        ]
    assert "dcgmi dmon (POWER [W], TOTEC [mJ], timestamps: date-times with their zone)" in line
    assert "energy from its total-energy counter" in line


def test_dcgm_dmon_without_timestamps_is_refused(tmp_path):
    log = tmp_path / "dmon.log"
    log.write_text("\n".join(dmon_lines()) + "\n")
    with pytest.raises(InputError, match="dcgmi dmon prints no timestamps"):
        analyze([TRACE], power_files=[log])


def test_zeus_power_monitor_csv_assumes_indices_with_a_warning(tmp_path):
    log = tmp_path / "power.csv"
    rows = [
        f"{(ZERO + int(t)) // 10**9}.{(ZERO + int(t)) % 10**9:09d},{POWER[0][i] / 1:.3f},{POWER[1][i]:.3f}"
        for i, t in enumerate(T)
    ]
    log.write_text("\n".join(rows) + "\n")
    assert detect_format(rows[:3]) == "zeus"
    with analyze([TRACE], power_files=[log]) as result:
        cum = {g: (T, trapezoid_cum(T, POWER[g])) for g in (0, 1)}
        assert check_energy(result, cum) == 24
        (line,) = [
            w
            for w in result.warnings
            if w.startswith("power log power.csv") and "outside the capture" not in w
        ]
    assert "Zeus PowerMonitor CSV (power [W] per GPU column (GPU indices assumed 0, 1, …)" in line


def test_a_gap_is_said_and_bridged_not_zero(tmp_path):
    log = tmp_path / "gap.csv"
    keep = (T < 80_000_000) | (T > 120_000_000)
    rows = ["timestamp, index, power.draw [W]"] + [
        f"{local(int(t))}, 0, {POWER[0][i]:.2f} W" for i, t in enumerate(T) if keep[i]
    ]
    log.write_text("\n".join(rows) + "\n")
    with analyze([TRACE], power_files=[f"{log},tz=+02:00"]) as result:
        check_energy(result, {0: (T[keep], trapezoid_cum(T[keep], POWER[0][keep]))})
        (line,) = [
            w
            for w in result.warnings
            if w.startswith("power log gap.csv") and "outside the capture" not in w
        ]
    assert "1 gap(s) longer than 5× the sampling interval (longest 0.042 s)" in line


def test_logs_the_tools_cannot_place_are_refused(tmp_path):
    window = tmp_path / "zeus.csv"
    window.write_text(
        "start_time,window_name,elapsed_time,gpu0_energy\n1790000000.1,step,2.5,300.1\n"
    )
    with pytest.raises(InputError, match="energy per measurement window"):
        log_samples(window)
    bare = tmp_path / "bare.csv"
    bare.write_text("2026/09/21 16:13:20.002, 0, 59.21\n")
    with pytest.raises(InputError, match=r"without a header .*columns=timestamp"):
        log_samples(f"{bare},tz=UTC")
    frame, note = log_samples(f"{bare},tz=UTC,columns=timestamp+index+power.draw")
    assert frame["power_w"].to_list() == [59.21] and "nvidia-smi CSV" in note


def test_uuid_matches_the_traced_gpu_and_index_needs_one_host(tmp_path):
    log = tmp_path / "u.csv"
    log.write_text(
        "timestamp, index, uuid, power.draw.instant [W], power.draw [W]\n"
        "2026/09/21 14:13:20.000, 3, GPU-ABCD0000-1111-2222-3333-444455556666, 250.00 W, 9 W\n"
        "2026/09/21 14:13:20.100, 3, GPU-ABCD0000-1111-2222-3333-444455556666, 260.00 W, 9 W\n"
    )
    samples, note = log_samples(f"{log},tz=UTC")
    assert "power.draw.instant [W]" in note and "GPUs matched by UUID" in note
    uuid = "GPU-abcd0000-1111-2222-3333-444455556666"
    marks = pl.DataFrame(
        schema={"host": pl.String, "pid": pl.Int64, "ts_ns": pl.Int64, "text": pl.String}
    )
    power = align(samples, marks, origin_utc_ns=ZERO, op_devices=[uuid])
    assert power.samples["device"].to_list() == [uuid, uuid]
    assert power.samples["t_ns"].to_list() == [0, 100_000_000]
    assert power.samples["power_w"].to_list() == [250.0, 260.0]
    by_index = samples.with_columns(pl.lit(None, dtype=pl.String).alias("uuid"))
    with pytest.raises(InputError, match="hosts a, b: say which, 'FILE,host=NAME'"):
        align(by_index, marks, origin_utc_ns=ZERO, op_devices=[], aliases={"a:3": "x", "b:3": "y"})
    with pytest.raises(InputError, match="no session start"):
        align(samples, marks, origin_utc_ns=None, op_devices=[uuid])


# --- a log longer than the capture ---------------------------------------------------------------

NO_MARKS = pl.DataFrame(
    schema={"host": pl.String, "pid": pl.Int64, "ts_ns": pl.Int64, "text": pl.String}
)
#: capture ends between readings (the log reads every ms from 0 to 204 ms)
SPAN = (20_500_000, 180_250_000)


def in_span_energy(t: np.ndarray, cum_j: np.ndarray, span: tuple[int, int]) -> float:
    """Energy over the span from the raw rows: the running total interpolated at its ends."""
    return expected(t, cum_j, *span)


def test_a_log_longer_than_the_capture_counts_only_the_capture(smi_log):
    samples, _ = log_samples(f"{smi_log},tz=+02:00")
    power = align(samples, NO_MARKS, origin_utc_ns=ZERO, op_devices=[], capture_span_ns=SPAN)
    cum = samples_mod.cumulative_energy(power)
    total = cum.group_by("device").agg(pl.col("cum_j").last() - pl.col("cum_j").first())
    keep = np.arange(T.size) != 50  # GPU 1's [N/A] row
    raw = {0: (T, POWER[0]), 1: (T[keep], POWER[1][keep])}
    for g, (t, watts) in raw.items():
        want = in_span_energy(t, trapezoid_cum(t, watts), SPAN)
        got = total.filter(pl.col("device") == f"?:{g}")["cum_j"].item()
        assert got == pytest.approx(want, rel=1e-12)
    outside = sum(int(((t < SPAN[0]) | (t > SPAN[1])).sum()) for t, _ in raw.values())
    (note,) = [w for w in power.warnings if "outside the capture" in w]
    assert f"smi.csv: {outside:,} of {keep.sum() + T.size:,} readings outside the capture" in note
    # the rows put at the ends are no readings: a span's samples are the raw rows inside it
    whole = pl.DataFrame(
        {"id": [0, 1], "device": ["?:0", "?:1"], "start_ns": [SPAN[0]] * 2, "end_ns": [SPAN[1]] * 2}
    )
    counted = samples_mod.interval_energy(cum, whole)
    inside = [int(((t >= SPAN[0]) & (t <= SPAN[1])).sum()) for t, _ in raw.values()]
    assert counted["n_samples"].to_list() == inside
    assert power.interval_ns == 1_000_000


def test_a_counter_log_and_a_capture_between_two_readings(tmp_path):
    log = tmp_path / "dmon.log"
    log.write_text("\n".join(stamped(dmon_lines())) + "\n")
    samples, _ = log_samples(log)
    keep = np.arange(T.size) != 30
    for span in (SPAN, (100_200_000, 100_700_000)):  # the second: no reading inside
        power = align(samples, NO_MARKS, origin_utc_ns=ZERO, op_devices=[], capture_span_ns=span)
        cum = samples_mod.cumulative_energy(power)
        assert power.source == "dcgm-counter"
        for g, first in ((0, 5_000_000), (1, 9_000_000)):
            counter = (first + np.cumsum(POWER[g].astype(int)))[keep] / 1000.0
            rows = cum.filter(pl.col("device") == f"?:{g}")
            got = rows["cum_j"].max() - rows["cum_j"].min()
            assert got == pytest.approx(in_span_energy(T[keep], counter, span), abs=1e-9)
            assert (rows["t_ns"].min(), rows["t_ns"].max()) == span


def test_without_a_span_the_log_is_kept_whole(smi_log):
    samples, _ = log_samples(f"{smi_log},tz=+02:00")
    power = align(samples, NO_MARKS, origin_utc_ns=ZERO, op_devices=[])
    assert power.samples.height == samples.height
    assert not [w for w in power.warnings if "outside the capture" in w]


# --- bad options and formats: one line each ------------------------------------------------------


@pytest.fixture(scope="module")
def three_logs(tmp_path_factory, smi_log) -> dict[str, str]:
    where = tmp_path_factory.mktemp("three")
    dmon = where / "dmon.log"
    dmon.write_text("\n".join(stamped(dmon_lines()[:20])) + "\n")
    zeus = where / "zeus.csv"
    zeus.write_text(f"{ZERO // 10**9}.000000000,100.000,200.000\n")
    return {"nvidia-smi": f"{smi_log},tz=+02:00", "dcgm": str(dmon), "zeus": str(zeus)}


@pytest.mark.parametrize("forced", sorted(FORMATS))
def test_a_format_forced_on_another_tools_file_is_one_line(three_logs, forced):
    for actual, given in three_logs.items():
        if actual == forced:
            assert log_samples(f"{given},format={forced}")[0].height > 0
            continue
        with pytest.raises(InputError, match=f"not a {FORMATS[forced]}") as caught:
            log_samples(f"{given},format={forced}")
        assert "\n" not in str(caught.value)


def test_a_misspelt_option_is_named(smi_log):
    with pytest.raises(InputError, match=r"unknown power-log option tzz \(expected tz, host"):
        log_samples(f"{smi_log},tzz=UTC")


def test_zeus_gpus_against_its_header(tmp_path):
    log = tmp_path / "zeus.csv"
    log.write_text(f"time,power0,power1\n{ZERO // 10**9}.5,100.0,200.0\n")
    with pytest.raises(InputError, match=r"gpus=0\+2 but the header names the columns"):
        log_samples(f"{log},gpus=0+2")
    frame, note = log_samples(f"{log},gpus=0+1")
    assert frame["device"].to_list() == [0, 1] and "(gpus= agrees)" in note
