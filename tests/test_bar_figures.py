"""The per-phase bar figures: one canvas at any number of steps, phases and GPUs; phase colours."""

import struct
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import polars as pl
import pytest
from matplotlib.patches import Rectangle
from nvtx_phases.analysis.render.figures import phases as figures

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

    def keep(fig, out, stem, data=None):
        fig.canvas.draw()
        saved.append(fig)
        return save(fig, out, stem, data=data)

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
    assert [p.suffix for p in small] == [p.suffix for p in large] == [".png", ".svg", ".csv"]
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


# --- the numbers drawn (figures/NAME.csv) and the share of a step -------------------------------


def _legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_stacked_legends_list_segments_top_to_bottom_as_stacked(tmp_path, drawn):
    figures.phase_time_per_step(_phases(3), tmp_path)
    figures.busy_idle_per_phase(_phases(3), tmp_path)
    stack, busy = (fig.axes[0] for fig in drawn)
    # each phase takes k+2 ms in a step of 0 ms: no 'other'; bottom to top in execution order
    assert _legend_labels(stack) == list(reversed(PHASES))
    bottoms = {p.get_label(): p.get_y() for p in stack.containers[0]}  # first container: gen
    assert set(bottoms.values()) == {0.0}
    assert _legend_labels(busy) == ["GPU idle", "GPU busy"]  # idle is stacked on busy


def _process_rows(process: int, attribution: str, walls: dict[int, dict[str, int]]) -> list[dict]:
    """``step`` and ``step/X`` rows of one process (or thread) with wall times in ms."""
    rows = []
    for step, phases in walls.items():
        for k, (name, ms) in enumerate(phases.items()):
            rows.append(
                {
                    "trace": f"rank{process}",
                    "pid": 100 + process,
                    "step": step,
                    "path": "step" if name == "step" else f"step/{name}",
                    "canonical": name,
                    "level": 0 if name == "step" else 1,
                    "attribution": attribution,
                    "n_ranges": 1,
                    "start_ns": step * 10_000 * MS + 1000 * process + k,
                    "wall_ns": ms * MS,
                    "energy_j": float(ms),
                    **dict.fromkeys(("gpu_busy_ns", "idle_ns", "nccl_ns", "memcpy_ns"), 0),
                    "memcpy_bytes": 0,
                }
            )
    return rows


def _read(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema_overrides={"bar": pl.String}, infer_schema_length=None)


@pytest.mark.parametrize(
    "schemes", [("projection", "projection"), ("window", "projection")], ids=["ranks", "threads"]
)
def test_several_step_ranges_per_step_share_the_pooled_step(tmp_path, schemes):
    """Two ranks (or two threads of one process, one per scheme) each mark the step: a segment
    is the mean per step range, a share the phases' sum over the steps' sum; nothing twice."""
    a = {1: {"step": 100, "gen": 60, "train": 30}, 2: {"step": 100, "gen": 50, "train": 30}}
    b = {1: {"step": 120, "gen": 90, "train": 20}, 2: {"step": 100, "gen": 70, "train": 20}}
    rows = _process_rows(0, schemes[0], a) + _process_rows(1, schemes[1], b)
    if schemes == ("window", "projection"):
        rows = [{**r, "trace": "one", "pid": 100} for r in rows]
    frame = pl.DataFrame(rows)
    stack = _read(figures.phase_time_per_step(frame, tmp_path)[2])
    got = {(r["bar"], r["phase"]): r["wall_ms"] for r in stack.iter_rows(named=True)}
    assert got == pytest.approx(
        {
            ("1", "gen"): 75.0,
            ("1", "train"): 25.0,
            ("1", "other (no phase)"): 10.0,  # (100 + 120) / 2 − 100
            ("2", "gen"): 60.0,
            ("2", "train"): 25.0,
            ("2", "other (no phase)"): 15.0,
        }
    )
    share = _read(figures.phase_share(frame, tmp_path)[2])
    gen = share.filter(pl.col("phase") == "gen").row(0, named=True)
    per_step = [100 * 150 / 220, 100 * 120 / 200]  # gen's sum over the steps' sum
    assert gen["time_share_median_pct"] == pytest.approx(float(np.median(per_step)))
    assert gen["energy_share_median_pct"] == pytest.approx(float(np.median(per_step)))
    assert gen["n_steps"] == 2


def test_binned_stack_is_the_mean_per_step_of_each_bin(tmp_path):
    walls = {s: {"step": 100 + s, "gen": 50 + s % 7, "train": 30} for s in range(1, 91)}
    walls[5] = {"step": 100, "gen": 50}  # no train in step 5: it counts 0 in its bin's mean
    stack = _read(
        figures.phase_time_per_step(pl.DataFrame(_process_rows(0, "window", walls)), tmp_path)[2]
    )
    assert stack["bar"].n_unique() == 40
    for row in stack.iter_rows(named=True):
        steps = range(row["first_step"], row["last_step"] + 1)
        assert row["n_steps"] == len(steps)
        if row["phase"] == "other (no phase)":
            total = sum(
                walls[s]["step"] - walls[s]["gen"] - walls[s].get("train", 0) for s in steps
            )
        else:
            total = sum(walls[s].get(row["phase"], 0) for s in steps)
        assert row["wall_ms"] == pytest.approx(total / len(steps))
    bar = stack.filter(pl.col("first_step") == 1)
    assert bar["bottom_ms"].to_list() == pytest.approx([0.0, *np.cumsum(bar["wall_ms"])[:-1]])


def test_without_step_ranges_no_share_and_phases_are_means_over_processes(tmp_path):
    rows = [
        r
        for r in _process_rows(0, "projection", {1: {"step": 100, "gen": 60}})
        if r["path"] != "step"
    ]
    rows += [
        r
        for r in _process_rows(1, "projection", {1: {"step": 100, "gen": 40}})
        if r["path"] != "step"
    ]
    # workers' top-level ranges, their step from a payload: no step range anywhere
    frame = pl.DataFrame(rows).with_columns(path=pl.col("canonical"), level=pl.lit(0))
    assert figures.phase_share(frame, tmp_path) == []
    stack = _read(figures.phase_time_per_step(frame, tmp_path)[2])
    assert stack.select("phase", "wall_ms").rows() == [("gen", 50.0)]  # mean of 60 and 40; no other


def test_without_power_no_energy_share_is_drawn_and_a_missing_one_is_not_zero(tmp_path, drawn):
    frame = _phases(3).with_columns(energy_j=pl.lit(None, pl.Float64))
    share = _read(figures.phase_share(frame, tmp_path)[2])
    assert share["energy_share_median_pct"].null_count() == share.height
    assert _legend_labels(drawn[-1].axes[0]) == ["time share", "p10–p90 over steps"]
    # one phase without energy where the others have it: its energy bar is not drawn (NaN)
    partial = _phases(3).with_columns(
        energy_j=pl.when(pl.col("canonical") == "adv").then(None).otherwise(pl.col("energy_j"))
    )
    share = _read(figures.phase_share(partial, tmp_path)[2])
    assert share.filter(pl.col("phase") == "adv")["energy_share_median_pct"].to_list() == [None]
    heights = [p.get_height() for p in drawn[-1].axes[0].patches]
    assert sum(np.isnan(heights)) == 1


def test_energy_per_gpu_data_past_8_gpus_is_the_median_over_gpus(tmp_path):
    devices = _phase_devices(12)
    data = _read(
        figures.energy_per_phase_device(devices, tmp_path, [f"step/{n}" for n in PHASES])[2]
    )
    assert data["phase"].to_list() == list(PHASES)
    for row in data.iter_rows(named=True):
        per_gpu = [
            sum(
                r["energy_j"]
                for r in devices.iter_rows(named=True)
                if (r["path"], r["device"]) == (row["path"], d)
            )
            for d in devices["device"].unique()
        ]
        assert row["n_gpus"] == 12
        got = [row["energy_p10_j"], row["energy_median_j"], row["energy_p90_j"]]
        assert got == pytest.approx(list(np.percentile(per_gpu, [10, 50, 90])))
