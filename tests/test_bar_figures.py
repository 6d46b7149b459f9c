"""The per-phase bar figures: one canvas at any number of steps, phases and GPUs; phase colours."""

import struct
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl
import pytest
from matplotlib.patches import Rectangle

from analysis.render import figures
from nvtx_phases.naming import phase_color

MS = 1_000_000
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
LONG = "compute_ref_log_prob_with_a_very_long_suffix"


def _phases(n_steps: int, names: tuple[str, ...] = PHASES) -> pl.DataFrame:
    """A driver's ``step`` and ``step/<phase>`` rows: phase k lasts k+1 ms, in ``names`` order."""
    rows = []
    for step in range(1, n_steps + 1):
        rows.append({"step": step, "path": "step", "canonical": "step", "level": 0, "k": -1})
        for k, name in enumerate(names):
            rows.append(
                {"step": step, "path": f"step/{name}", "canonical": name, "level": 1, "k": k}
            )
    return (
        pl.DataFrame(rows)
        .with_columns(
            start_ns=pl.col("step") * 1000 * MS + pl.col("k") + 1,
            wall_ns=(pl.col("k") + 2) * MS,
            gpu_busy_ns=(pl.col("k") + 1) * MS,
            idle_ns=pl.lit(MS),
            nccl_ns=pl.lit(MS // 2),
            memcpy_ns=pl.lit(MS // 4),
            memcpy_bytes=(pl.col("k") + 1) * 1_000_000,
            energy_j=(pl.col("k") + 1) * 10.0 + pl.col("step") % 3,
        )
        .drop("k")
    )


def _phase_devices(n_gpus: int, names: tuple[str, ...] = PHASES) -> pl.DataFrame:
    """3 steps × ``n_gpus`` GPUs of ``step/<phase>`` rows; GPU g's phase k uses (k+1)·(g+1) J."""
    rows = [
        {
            "step": step,
            "path": f"step/{name}",
            "device": f"GPU-{g:08x}-aaaa-bbbb-cccc-dddddddddddd",
            "energy_j": (k + 1.0) * (g + 1),
        }
        for step in (1, 2, 3)
        for k, name in enumerate(names)
        for g in range(n_gpus)
    ]
    return pl.DataFrame(rows)


def _png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def _draw(kind: str, frame: pl.DataFrame, out: Path) -> list[Path]:
    if kind == "energy_per_phase_device":
        order = [f"step/{n}" for n in PHASES]
        return figures.energy_per_phase_device(frame, out, order)
    return getattr(figures, kind)(frame, out)


@pytest.fixture
def drawn(monkeypatch):
    """The figures ``save_figure`` saves, drawn (so extents are known), in call order."""
    saved: list[plt.Figure] = []
    save = figures.save_figure

    def keep(fig, out, stem):
        fig.canvas.draw()
        saved.append(fig)
        return save(fig, out, stem)

    monkeypatch.setattr(figures, "save_figure", keep)
    return saved


BAR_FIGURES = ("phase_share", "busy_idle_per_phase", "data_movement_per_phase")


@pytest.mark.parametrize("kind", [*BAR_FIGURES, "energy_per_phase_device"])
def test_one_canvas_at_3_steps_2_gpus_and_at_many_steps_gpus_and_long_phase_names(kind, tmp_path):
    many_names = (*PHASES, *(f"{LONG}_{k}" for k in range(8)))
    if kind == "energy_per_phase_device":
        few, many = _phase_devices(2), _phase_devices(48, many_names)
    else:
        few, many = _phases(3), _phases(600, many_names)
    small = _draw(kind, few, tmp_path / "few")
    large = _draw(kind, many, tmp_path / "many")
    assert [p.suffix for p in small] == [p.suffix for p in large] == [".png", ".svg"]
    assert _png_size(small[0]) == _png_size(large[0]) == (1600, 800)  # 8 x 4 in at 200 dpi


def test_long_phase_names_are_cut_in_the_middle_and_slanted(tmp_path, drawn):
    names = ("gen", "compute_ref_log_prob", "dump_rollout_generations", f"{LONG}_1", f"{LONG}_2")
    figures.busy_idle_per_phase(_phases(3, names), tmp_path)
    (fig,) = drawn
    ticks = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == [
        "gen",
        "compute_ref_log_prob",
        "dump_rollo…generations",
        "compute_re…ng_suffix_1",
        "compute_re…ng_suffix_2",
    ]
    assert [t.get_rotation() for t in ticks] == [30.0] * 5


@pytest.mark.parametrize("kind", [*BAR_FIGURES, "energy_per_phase_device"])
def test_legend_is_right_of_the_data_and_phases_in_their_colours(kind, tmp_path, drawn):
    frame = _phase_devices(2) if kind == "energy_per_phase_device" else _phases(3)
    _draw(kind, frame, tmp_path)
    (fig,) = drawn
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend.get_window_extent().x0 > ax.get_window_extent().x1
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == list(PHASES)
    first_bars = [p for p in ax.patches if isinstance(p, Rectangle)][: len(PHASES)]
    expected = [phase_color(n) & 0xFFFFFF for n in PHASES]
    got = [int.from_bytes(bytes(round(255 * c) for c in p.get_facecolor()[:3])) for p in first_bars]
    assert got == expected
    assert all(a.get_ylabel().endswith(")") for a in fig.axes)  # a unit on every value axis


def test_data_movement_joins_no_phases_with_a_line(tmp_path, drawn):
    figures.data_movement_per_phase(_phases(3), tmp_path)
    (fig,) = drawn
    data_lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert [line for line in data_lines if len(line.get_xdata()) > 1] == []
    assert [a.get_ylabel() for a in fig.axes] == [
        "time, all GPUs\nand steps (ms)",
        "memcpy bytes\n(MB)",
    ]
    # phase k copies k+1 MB in each of 3 steps
    bytes_bars = [p.get_height() for p in fig.axes[1].patches]
    assert bytes_bars == pytest.approx([3.0 * (k + 1) for k in range(len(PHASES))])


def test_energy_at_12_gpus_is_the_median_over_gpus_with_a_p10_p90_whisker(tmp_path, drawn):
    figures.energy_per_phase_device(_phase_devices(12), tmp_path, [f"step/{n}" for n in PHASES])
    (fig,) = drawn
    ax = fig.axes[0]
    assert len(ax.patches) == len(PHASES)  # one bar per phase, not one per GPU
    # GPU g's phase k: 3 steps × (k+1)(g+1) J; median over g = 0..11 of (g+1) is 6.5
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([3 * (k + 1) * 6.5 for k in range(len(PHASES))])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["median over 12 GPUs", "p10–p90 over GPUs"]
    assert ax.get_ylabel() == "energy per GPU, all steps (J)"


def test_energy_at_2_gpus_draws_a_bar_per_gpu_labelled_by_device(tmp_path, drawn):
    figures.energy_per_phase_device(_phase_devices(2), tmp_path, [f"step/{n}" for n in PHASES])
    (fig,) = drawn
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * len(PHASES)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["GPU-00000000", "GPU-00000001"]


def test_phase_share_whiskers_span_p10_to_p90_over_steps(tmp_path, drawn):
    figures.phase_share(_phases(10), tmp_path)
    (fig,) = drawn
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["time share", "energy share", "p10–p90 over steps"]
    assert fig.axes[0].get_ylabel() == "share of step (%)"


def test_adv_and_update_weights_have_clearly_different_colours():
    def rgb(name: str) -> tuple[int, int, int]:
        c = phase_color(name)
        return (c >> 16) & 0xFF, (c >> 8) & 0xFF, c & 0xFF

    adv, weights = rgb("adv"), rgb("update_weights")
    assert sum(abs(a - b) for a, b in zip(adv, weights, strict=True)) > 150
    assert phase_color("gen") == phase_color("generate_sequences")
    assert phase_color("ref") == phase_color("compute_ref_log_prob")
