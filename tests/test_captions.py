"""Figure captions: every figure the tool writes has one, and the report shows it under the figure.
Also the canvas and legends of the what-if and power-envelope figures at few and many steps/GPUs."""

from __future__ import annotations

import re
from pathlib import Path

import nvtx_phases.analysis.render.figures.phases as figures
import polars as pl
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from nvtx_phases.analysis.aggregate.steps import STEP_METRICS
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.render.figures.captions import (
    FIGURE_CAPTIONS,
    VERL_LOGS_CAPTIONS,
    caption_for,
    compare_caption,
)
from nvtx_phases.analysis.render.figures.envelope import power_envelope_figure
from nvtx_phases.analysis.render.outputs.files import _FIGURE_STEMS
from nvtx_phases.analysis.render.report.html_page import escape_html
from nvtx_phases.analysis.render.report.whatif import whatif_figure
from nvtxp_testkit import SAMPLES
from PIL import Image
from typer.testing import CliRunner

from nvtx_phases.naming import phase_color

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
#: stems written outside ``_FIGURE_STEMS``: the power envelope (analyze) and what-if (whatif)
OTHER_STEMS = ("power_envelope", "whatif_per_step", "idle_by_cause")


@pytest.mark.parametrize("stem", [*_FIGURE_STEMS, *OTHER_STEMS])
def test_every_figure_has_a_caption(stem):
    text = caption_for(stem)
    assert text == FIGURE_CAPTIONS[stem]
    assert 40 < len(text) < 600 and text.endswith(".")
    assert 1 <= text.count(". ") + 1 <= 4  # 1–3 sentences (an abbreviation may add one)


def test_captions_cover_exactly_the_known_figures():
    assert set(FIGURE_CAPTIONS) == {*_FIGURE_STEMS, *OTHER_STEMS}
    assert set(VERL_LOGS_CAPTIONS) == {"phase_share"}
    assert caption_for("no_such_figure") == ""
    assert caption_for("compare_no_such_metric") == ""


@pytest.mark.parametrize("metric", list(STEP_METRICS))
def test_compare_figures_get_compare_caption(metric):
    assert caption_for(f"compare_{metric}") == compare_caption(metric)
    assert caption_for(f"compare_{metric}") != ""


def test_report_shows_each_caption_under_its_figure(tmp_path):
    out = tmp_path / "tmp"
    result = runner().invoke(app, ["report", str(SAMPLE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text(encoding="utf-8")
    shown = re.findall(
        r'<figure [^>]*><img alt="([^"]+)"[^>]*><figcaption>(.*?)</figcaption>', page
    )
    stems = [stem for stem, _ in shown]
    written = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert sorted(stems) == written
    assert {"phase_time_per_step", "power_envelope", "straggler_timeline"} <= set(stems)
    for stem, text in shown:
        title = stem.replace("_", " ")
        assert text == f"<b>{title}</b>: {escape_html(FIGURE_CAPTIONS[stem])}"
    assert "&#x27;other (no phase)&#x27;" in page  # quotes in a caption are escaped


def runner() -> CliRunner:
    return CliRunner()


def _capture(monkeypatch) -> list:
    """Keep each figure ``save_figure`` is given (it is still saved and closed)."""
    kept: list = []
    real = figures.save_figure

    def save(fig, out: Path, stem: str, data=None):
        kept.append(fig)
        return real(fig, out, stem, data=data)

    monkeypatch.setattr(figures, "save_figure", save)
    return kept


def _whatif_table(n_steps: int) -> pl.DataFrame:
    rows = []
    for step in range(1, n_steps + 1):
        measured = 10.0 + step % 3
        for bound, variant, bound_s in (
            ("overlap_gen_train", "separate_gpus", 6.0),
            ("no_transitions", "between_phases", measured - 0.5),
            ("balanced_dp", "gen", 1.0),  # a phase row: not drawn
        ):
            rows.append((step, bound, variant, measured, bound_s))
    return pl.DataFrame(
        rows, schema=["step", "bound", "variant", "measured_s", "bound_s"], orient="row"
    )


@pytest.mark.parametrize(
    ("n_steps", "points", "xlabel"),
    [
        (3, 3, "step"),
        (41, 40, "step (median per bin of 1–2 steps)"),
        (1000, 40, "step (median per bin of 25 steps)"),
    ],
)
def test_whatif_figure_fixed_canvas_binned_legend_outside(
    tmp_path, monkeypatch, n_steps, points, xlabel
):
    kept = _capture(monkeypatch)
    paths = whatif_figure(_whatif_table(n_steps), tmp_path)
    assert [p.name for p in paths][:2] == ["whatif_per_step.png", "whatif_per_step.svg"]
    assert Image.open(paths[0]).size == (1600, 800)
    (ax,) = kept[0].axes
    lines = {line.get_label(): len(line.get_xdata()) for line in ax.get_lines()}
    assert lines == {
        "measured": points,
        "overlap_gen_train / separate_gpus": points,
        "no_transitions / between_phases": points,
    }
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    band = ["measured, p10–p90\nover the bin's steps"] if n_steps > 40 else []
    assert labels == ["measured", *band, *list(lines)[1:]]
    renderer = FigureCanvasAgg(kept[0]).get_renderer()
    assert legend.get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    assert ax.get_ylabel() == "step time (s)"
    assert ax.get_xlabel() == xlabel
    # markers only while each step is its own point
    assert {line.get_marker() for line in ax.get_lines()} == ({"o", "."} if n_steps <= 40 else {""})


def _envelope(n_gpus: int, n_phases: int) -> pl.DataFrame:
    base = {"n_gpus": 1, "n_ranges": 3, "n_samples": 50, "few_samples": False}
    rows = []
    for i in range(n_phases):
        watts = {"p50_w": 100.0 + i, "p95_w": 120.0 + i, "max_w": 130.0 + i}
        for d in range(n_gpus):
            rows.append({"scope": "gpu", "path": f"step/p{i}", "device": f"{d}", **base, **watts})
        rows.append(
            {"scope": "node", "path": f"step/p{i}", "host": "h", **base, **watts}
            | {"energy_share_pct": 5.0, "ramp_w_per_ms": 2.0, "ramp_max_w_per_ms": 3.0}
        )
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.with_columns(
        pl.lit("energy_counter").alias("power_from"), pl.lit(0.3).alias("ramp_window_ms")
    )


@pytest.mark.parametrize(("n_gpus", "n_phases"), [(2, 3), (16, 30)])
def test_power_envelope_fixed_canvas_gpus_capped(tmp_path, monkeypatch, n_gpus, n_phases):
    kept = _capture(monkeypatch)
    paths = power_envelope_figure(_envelope(n_gpus, n_phases), tmp_path)
    assert Image.open(paths[0]).size == (1600, 1400)
    gpu_ax = kept[0].axes[0]
    labels = [t.get_text() for t in gpu_ax.get_legend().get_texts()]
    if n_gpus > 8:
        assert labels == ["median of 16 GPUs", "lowest p50 to\nhighest max"]
    else:
        assert labels == ["GPU 0", "GPU 1"]
    renderer = FigureCanvasAgg(kept[0]).get_renderer()
    legend = gpu_ax.get_legend().get_window_extent(renderer)
    assert legend.x0 > gpu_ax.get_window_extent(renderer).x1
    ticks = [t.get_text() for t in kept[0].axes[-1].get_xticklabels()]
    assert ticks == [f"p{i}" for i in range(n_phases)]
    assert [ax.get_ylabel() for ax in kept[0].axes] == [
        "GPU power (W)",
        "node power (W)",
        "power ramp (W/ms)",
    ]


def test_power_envelope_node_bars_in_phase_colours_nodes_by_hatch(tmp_path, monkeypatch):
    kept = _capture(monkeypatch)
    one = _envelope(2, 2).with_columns(pl.col("path").str.replace(r"p0$", "gen"))
    one = one.with_columns(pl.col("path").str.replace(r"p1$", "update_actor"))
    two = pl.concat([one, one.filter(pl.col("scope") == "node").with_columns(host=pl.lit("g"))])
    power_envelope_figure(two, tmp_path)
    node_ax = kept[0].axes[1]
    bars = node_ax.patches
    gen, actor = (to_hex(phase_color_hex(n)) for n in ("gen", "update_actor"))
    # two nodes × two phases: node g first (no hatch), then node h (hatched)
    assert [to_hex(b.get_facecolor()) for b in bars] == [gen, actor, gen, actor]
    assert [b.get_hatch() for b in bars] == ["", "", "////", "////"]
    legend = node_ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["node g", "node h"]
    renderer = FigureCanvasAgg(kept[0]).get_renderer()
    assert legend.get_window_extent(renderer).x0 > node_ax.get_window_extent(renderer).x1


def phase_color_hex(name: str) -> str:
    return f"#{phase_color(name) & 0xFFFFFF:06x}"


def test_power_envelope_data_past_8_gpus_is_over_the_gpus(tmp_path):
    envelope = _envelope(16, 3).with_columns(
        (pl.col("p50_w") + pl.col("device").cast(pl.Float64, strict=False).fill_null(0)).alias(
            "p50_w"
        )
    )
    paths = power_envelope_figure(envelope, tmp_path)
    assert [p.suffix for p in paths] == [".png", ".svg", ".csv"]
    data = pl.read_csv(paths[2], infer_schema_length=None)
    gpus = data.filter(pl.col("panel") == "gpus")
    assert gpus["path"].to_list() == ["step/p0", "step/p1", "step/p2"]
    for row in gpus.iter_rows(named=True):
        mine = [
            r
            for r in envelope.iter_rows(named=True)
            if r["scope"] == "gpu" and r["path"] == row["path"]
        ]
        p50 = sorted(r["p50_w"] for r in mine)
        assert row["n_gpus"] == 16
        assert row["p50_w"] == pytest.approx((p50[7] + p50[8]) / 2)  # median of 16
        assert (row["lowest_p50_w"], row["highest_max_w"]) == (
            p50[0],
            max(r["max_w"] for r in mine),
        )
    nodes = data.filter(pl.col("panel") == "node")
    assert nodes.select("path", "host", "p50_w", "energy_share_pct", "ramp_w_per_ms").rows() == [
        (f"step/p{i}", "h", 100.0 + i, 5.0, 2.0) for i in range(3)
    ]
