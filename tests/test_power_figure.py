"""The power figures: overview of the whole run and detail of chosen steps (power_figure)."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest
from matplotlib.collections import PolyCollection
from nvtx_phases.analysis.aggregate.step_stack import (
    default_detail_steps,
    resolve_detail_steps,
    step_windows,
)
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import InputError
from nvtx_phases.analysis.render.figures.power import (
    detail_figure,
    overview_figure,
    power_timeline,
    power_timeline_detail,
)
from nvtxp_testkit import SAMPLES
from PIL import Image
from typer.testing import CliRunner

PHASES = ("gen", "reward", "update_actor")
MS = 1_000_000


def _run(n_steps: int, n_gpus: int, step_ms: list[int] | None = None, interval_ns: int = MS):
    """Phases, steps and power samples of a run: step k lasts ``step_ms[k-1]`` ms (default 30),
    split evenly into three driver phases, 2 ms apart; one sample per ``interval_ns`` per GPU."""
    step_ms = step_ms or [30] * n_steps
    rows, steps, t = [], [], 0
    for step, dur in enumerate(step_ms, start=1):
        start, end = t, t + dur * MS
        rows.append(("step", "step", step, start, end))
        third = (end - start) // 3
        for k, name in enumerate(PHASES):
            rows.append((f"step/{name}", name, step, start + k * third, start + (k + 1) * third))
        steps.append((step, start, end))
        t = end + 2 * MS
    phases = pl.DataFrame(
        rows, schema=["path", "canonical", "step", "start_ns", "end_ns"], orient="row"
    ).with_columns(attribution=pl.lit("window"))
    steps_df = pl.DataFrame(steps, schema=["step", "step_start_ns", "step_end_ns"], orient="row")
    times = pl.int_range(0, t, interval_ns, eager=True)
    samples = pl.concat(
        pl.DataFrame(
            {"device": f"run:{g}", "t_ns": times, "power_w": 100.0 + 10 * g + (times // MS % 7)}
        )
        for g in range(n_gpus)
    )
    return phases, steps_df, samples


def _png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


def test_same_canvas_at_3_and_600_steps(tmp_path):
    sizes = set()
    for n, gpus in ((3, 2), (600, 8)):
        phases, steps, samples = _run(n, gpus)
        out = tmp_path / str(n)
        written = power_timeline(phases, samples, out)
        written += power_timeline_detail(phases, samples, steps, out)
        assert [p.name for p in written] == [
            f"{stem}.{ext}"
            for stem in ("power_timeline", "power_timeline_detail")
            for ext in ("png", "svg", "csv")
        ]
        sizes |= {
            _png_size(out / "power_timeline.png"),
            _png_size(out / "power_timeline_detail.png"),
        }
    assert sizes == {(1600, 900)}  # 8 x 4.5 in at 200 dpi


@pytest.mark.parametrize("n_steps", [3, 600])
def test_overview_has_one_line_per_gpu_and_one_ribbon_collection_per_phase(n_steps):
    phases, _, samples = _run(n_steps, 8)
    fig, _ = overview_figure(phases, samples)
    ribbon, ax = fig.axes[:2]
    assert [line.get_label() for line in ax.get_lines()] == [f"GPU run:{g}" for g in range(8)]
    assert len(ribbon.collections) == len(PHASES)
    spans = [len(c.get_paths()) for c in ribbon.collections]
    assert spans == [n_steps] * len(PHASES)  # every step's span, in one collection per phase
    assert ax.get_ylabel() == "power (W)"
    # 600 steps of 32 ms: 19.2 s of run clock, in seconds; 3 steps in ms
    assert ax.get_xlabel() == ("time (s, run clock)" if n_steps == 600 else "time (ms, run clock)")
    plt.close(fig)


def test_overview_bins_whole_steps_past_the_sample_limit():
    phases, _, samples = _run(600, 8, interval_ns=MS // 4)  # 76,800 samples per GPU
    fig, _ = overview_figure(phases, samples)
    ax = fig.axes[1]
    # 1,800 driver phases, more than 2 x 300 bins: 300 bins of 2 whole steps, one point each
    assert {len(line.get_xdata()) for line in ax.get_lines()} == {300}
    band = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert [c.get_label() for c in band] == ["min–max, all GPUs\n(lines: mean per 2 steps)"]
    plt.close(fig)


def test_overview_bins_phases_when_there_are_few():
    phases, _, samples = _run(60, 2, interval_ns=MS // 4)  # 7,680 samples per GPU
    fig, _ = overview_figure(phases, samples)
    ax = fig.axes[1]
    # 180 driver phases: one bin each (start to the next phase's start), x at the bin's centre
    lines = ax.get_lines()
    assert [len(line.get_xdata()) for line in lines] == [180, 180]
    assert [float(line.get_xdata()[0]) for line in lines] == [5.0, 5.0]  # ms: bin 0 to 10 ms
    # GPU 1 draws 10 W above GPU 0 in every sample, so in every bin's mean
    assert list(lines[1].get_ydata() - lines[0].get_ydata()) == [10.0] * 180
    band = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert [c.get_label() for c in band] == ["min–max, all GPUs\n(lines: mean per phase)"]
    plt.close(fig)


def test_detail_x_limits_cover_only_the_chosen_steps():
    phases, steps, samples = _run(5, 2, step_ms=[30, 40, 50, 60, 70])
    fig, _ = detail_figure(phases, samples, steps, {2: "chosen", 4: "chosen"})
    ribbons, panels = fig.axes[:2], fig.axes[2:]  # a row of ribbons over a row of panels
    assert [tuple(ax.get_xlim()) for ax in panels] == [(0.0, 40.0), (0.0, 60.0)]
    assert [tuple(ax.get_xlim()) for ax in ribbons] == [(0.0, 40.0), (0.0, 60.0)]
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_title())
    assert titles == ["step 2 (40 ms)", "step 4 (60 ms)"]
    plt.close(fig)


def test_default_detail_steps_are_the_median_and_the_longest():
    _, steps, _ = _run(5, 1, step_ms=[10, 30, 20, 50, 40])
    windows = step_windows(steps)
    assert default_detail_steps(windows) == {2: "median duration", 4: "longest"}
    _, even, _ = _run(4, 1, step_ms=[40, 10, 20, 30])
    assert default_detail_steps(step_windows(even)) == {1: "longest", 3: "median duration"}
    _, one, _ = _run(1, 1)
    assert default_detail_steps(step_windows(one)) == {1: "median and longest"}


def test_detail_steps_are_checked():
    _, steps, _ = _run(5, 1)
    windows = step_windows(steps)
    assert resolve_detail_steps(windows, "2,4:5") == {2: "chosen", 4: "chosen", 5: "chosen"}
    with pytest.raises(InputError) as missing:
        resolve_detail_steps(windows, "2,9")
    assert str(missing.value) == "--detail-steps '2,9': no step 9 (steps available: 1:5)"
    with pytest.raises(InputError) as many:
        resolve_detail_steps(windows, "1:5")
    assert str(many.value).startswith("--detail-steps '1:5' chooses 5 steps; the detail shows at")
    with pytest.raises(InputError) as bad:
        resolve_detail_steps(windows, "x")
    assert str(bad.value).startswith("--detail-steps 'x': 'x' is not a step N")


def test_cli_names_a_missing_detail_step_and_writes_nothing(tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "report",
            str(SAMPLES / "grpo_synthetic.sqlite"),
            "--out",
            str(out),
            "--detail-steps",
            "2,7",
        ],
    )
    assert result.exit_code == 2
    assert "--detail-steps '2,7': no step 7 (steps available: 1:3)" in result.stderr
    assert not out.exists()


def _in_bin(samples: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    return samples.filter((pl.col("t_ns") >= start) & (pl.col("t_ns") < end))


def test_overview_data_binned_means_and_band_equal_the_samples_in_each_bin(tmp_path):
    phases, _, samples = _run(60, 2, interval_ns=MS // 4)  # dense: a bin per driver phase
    power_timeline(phases, samples, tmp_path)
    data = pl.read_csv(tmp_path / "power_timeline.csv", infer_schema_length=None)
    lines, band = (data.filter(pl.col("kind") == k) for k in ("gpu", "band"))
    assert lines.height == 2 * 180 and band.height == 180
    for row in lines.iter_rows(named=True):
        rows = _in_bin(
            samples.filter(pl.col("device") == row["device"]), row["start_ns"], row["end_ns"]
        )
        assert row["power_w"] == pytest.approx(sum(rows["power_w"]) / rows.height)
        assert row["t_ns"] == (row["start_ns"] + row["end_ns"]) // 2
    for row in band.iter_rows(named=True):
        rows = _in_bin(samples, row["start_ns"], row["end_ns"])
        assert (row["power_low_w"], row["power_high_w"]) == (
            min(rows["power_w"]),
            max(rows["power_w"]),
        )
    # every sample lies in exactly one bin
    assert (
        sum(_in_bin(samples, s, e).height for s, e in band.select("start_ns", "end_ns").rows())
        == samples.height
    )


def test_overview_data_past_10_gpus_is_the_median_of_the_gpus_means(tmp_path):
    phases, _, samples = _run(3, 12)
    power_timeline(phases, samples, tmp_path)
    data = pl.read_csv(tmp_path / "power_timeline.csv", infer_schema_length=None)
    median = data.filter(pl.col("kind") == "median")
    assert set(median["label"]) == {"median of 12 GPUs"} and median.height == 9  # a bin per phase
    for row in median.iter_rows(named=True):
        rows = _in_bin(samples, row["start_ns"], row["end_ns"])
        means = [sum(g["power_w"]) / g.height for g in rows.partition_by("device")]
        p10, p50, p90 = np.percentile(means, [10, 50, 90])
        got = (row["power_low_w"], row["power_w"], row["power_high_w"])
        assert got == pytest.approx((p10, p50, p90))
