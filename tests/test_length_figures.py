"""Length and straggler figures: one canvas at any step count, the cap line, ranks by GPU."""

from pathlib import Path

import matplotlib
import polars as pl
import pytest
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from nvtx_phases.analysis.render.figures import lengths as length_figures
from nvtx_phases.analysis.render.figures.lengths import (
    length_cdf,
    length_heatmap,
    straggler_timeline,
)


@pytest.fixture
def kept_figures(monkeypatch):
    """Keep each drawn figure open (save_figure closes it) so its artists can be inspected."""
    kept = []

    def save(fig, out, stem, data=None):
        kept.append(fig)
        out.mkdir(parents=True, exist_ok=True)
        path = Path(out) / f"{stem}.png"
        fig.savefig(path, dpi=200)
        return [path]

    monkeypatch.setattr(length_figures, "save_figure", save)
    yield kept
    plt.close("all")


def _responses(steps: int) -> pl.DataFrame:
    lengths = [8, 30, 100, 300, 900, 2000]
    return pl.DataFrame(
        {
            "step": [s for s in range(1, steps + 1) for _ in lengths],
            "output_len": [n + s % 5 for s in range(1, steps + 1) for n in lengths],
        }
    )


def _tails(steps: int, devices: list[str | None]) -> pl.DataFrame:
    rows = []
    for s in range(1, steps + 1):
        for r, device in enumerate(devices):
            end = 100 + 10 * r
            rows.append((s, 1000 + r, device, 0, end, (100 + 10 * (len(devices) - 1) - end) * 1e6))
    return pl.DataFrame(
        rows,
        schema={
            "step": pl.Int64,
            "pid": pl.Int64,
            "device": pl.String,
            "gen_start_ns": pl.Int64,
            "gen_end_ns": pl.Int64,
            "idle_tail_ns": pl.Float64,
        },
        orient="row",
    ).with_columns(pl.col("gen_end_ns") * 1_000_000)


def test_cap_line_drawn_at_the_cap_and_absent_without_it(tmp_path, kept_figures):
    length_cdf(_responses(3), tmp_path / "a", cap=4096)
    length_heatmap(_responses(3), tmp_path / "b", cap=4096)
    length_cdf(_responses(3), tmp_path / "c")
    cdf, heat, bare = (f.axes[0] for f in kept_figures)
    assert [list(line.get_xdata()) for line in cdf.lines if line.get_linestyle() == "--"] == [
        [4096, 4096]
    ]
    assert [list(line.get_ydata()) for line in heat.lines] == [[4096, 4096]]
    assert [line.get_linestyle() for line in bare.lines] == ["-", "-", "-"]
    # the heatmap's y axis spans the data (9…2003 tokens) and the cap, not 1 token upwards
    low, high = heat.get_ylim()
    assert low == pytest.approx(9) and 4096 < high < 4096 * 1.3


def test_one_canvas_at_3_and_1000_steps(tmp_path):
    sizes = set()
    for steps in (3, 1000):
        out = tmp_path / str(steps)
        for path in (
            length_heatmap(_responses(steps), out, cap=4096)
            + length_cdf(_responses(steps), out, cap=4096)
            + straggler_timeline(_tails(steps, ["a:0", "a:1"]), out)
        ):
            if path.suffix == ".png":
                sizes.add((path.stem, Image.open(path).size))
    assert sizes == {
        ("length_heatmap", (1600, 800)),
        ("length_cdf", (1600, 800)),
        ("straggler_timeline", (1600, 900)),
    }


def test_straggler_rows_are_ranks_by_gpu_over_every_step(tmp_path, kept_figures):
    devices = ["GPU-0123456789abcdef", "node:1", "node:1", None]
    straggler_timeline(_tails(60, devices), tmp_path)
    heat, gen = kept_figures[0].axes[:2]
    labels = [t.get_text() for t in heat.get_yticklabels()]
    assert labels == ["GPU-01234567", "GPU node:1 · pid 1001", "GPU node:1 · pid 1002", "pid 1003"]
    cells = heat.collections[0].get_array()
    assert cells.shape == (4, 60)
    # rank 3 (pid 1003) ends last: tail 0; rank 0 waits 30 ms in every step
    assert list(cells[3]) == [0.0] * 60 and list(cells[0]) == [30.0] * 60
    slowest, median = (line.get_ydata() for line in gen.lines)
    assert list(slowest) == [130.0] * 60 and list(median) == [115.0] * 60


def test_heatmap_pools_steps_beyond_100_and_ticks_round_steps(tmp_path, kept_figures):
    length_heatmap(_responses(1000), tmp_path / "many")
    length_heatmap(_responses(21), tmp_path / "few")
    many, few = (f.axes[0] for f in kept_figures)
    assert many.collections[0].get_array().shape == (40, 100)
    assert many.get_title() == "Response-length distribution over steps (1000 steps in 100 columns)"
    assert [t.get_text() for t in many.get_xticklabels()] == [str(s) for s in range(100, 1001, 100)]
    assert many.get_xlim() == (0, 1000)
    assert few.collections[0].get_array().shape == (40, 21)
    assert [t.get_text() for t in few.get_xticklabels()] == [str(s) for s in range(2, 21, 2)]


def test_heatmap_data_pools_columns_and_each_share_counts_its_responses(tmp_path):
    responses = _responses(250)  # 100 columns of 2 or 3 consecutive steps
    data = pl.read_csv(length_heatmap(responses, tmp_path)[2], infer_schema_length=None)
    cells = data.filter(pl.col("kind") == "cell")
    assert cells["column"].n_unique() == 100 and "cap" not in data["kind"].to_list()
    last_edge = cells["length_high_tokens"].max()
    for (column,), rows in cells.partition_by("column", as_dict=True).items():
        first, last = rows["first_step"][0], rows["last_step"][0]
        assert last - first + 1 == (2 if column % 2 else 3)  # step k in column k * 100 // 250
        lengths = responses.filter(pl.col("step").is_between(first, last))["output_len"].to_list()
        assert set(rows["n_responses"]) == {len(lengths)}
        for low, high, share in rows.select(
            "length_low_tokens", "length_high_tokens", "share_of_responses"
        ).rows():
            n = sum(low <= x < high or (high == last_edge and x == high) for x in lengths)
            assert share == pytest.approx(n / len(lengths))


def test_straggler_data_is_each_ranks_tail_and_the_slowest_and_median_generation(tmp_path):
    tails = _tails(4, ["a:0", "a:1", "a:2"])
    data = pl.read_csv(straggler_timeline(tails, tmp_path)[2], infer_schema_length=None)
    heat = data.filter(pl.col("kind") == "idle_tail")
    assert heat.select("step", "pid", "idle_tail_ms").rows() == [
        (s, 1000 + r, float(20 - 10 * r)) for s in range(1, 5) for r in range(3)
    ]
    gen = data.filter(pl.col("kind") == "generation")
    assert gen.select("step", "gen_slowest_ms", "gen_median_ms").rows() == [
        (s, 120.0, 110.0) for s in range(1, 5)
    ]
