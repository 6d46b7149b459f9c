"""The report (human units, "what stands out", table CSVs, escaping), the run comparison
(% difference, every metric, execution order, figures, compare.html), the terminal table and
the report-shots script's refusal without Chromium."""

from __future__ import annotations

import dataclasses
import re

import polars as pl
import pytest
from nvtx_phases.analysis.render.figures.compare import FIGSIZE
from nvtx_phases.analysis.render.figures.phases import DPI
from nvtx_phases.analysis.render.outputs.compare_files import write_comparison
from nvtx_phases.analysis.render.report.document import (
    phase_summary,
    report_tables,
    to_html,
    to_markdown,
    write_report,
)
from nvtx_phases.analysis.render.report.findings import what_stands_out
from nvtx_phases.analysis.render.report.units import humanize
from nvtx_phases.analysis.render.terminal import phase_rich_tables
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.workload.compare import compare_runs
from nvtx_phases.analysis.workload.stragglers import generation_tails
from nvtxp_testkit import SAMPLES
from PIL import Image
from rich.console import Console

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
CPU = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def sample():
    with analyze([SAMPLE]) as result:
        yield result


@pytest.fixture(scope="module")
def cpu():
    with analyze([CPU]) as result:
        yield result


def _with_gen_wall(analysis, wall_ns: int, *, rename: str | None = None):
    """The run with every window ``step/gen`` row lasting ``wall_ns`` (and renamed)."""
    gen = (pl.col("path") == "step/gen") & (pl.col("attribution") == "window")
    phases = analysis.phases.with_columns(
        pl.when(gen).then(wall_ns).otherwise(pl.col("wall_ns")).alias("wall_ns")
    )
    if rename:
        phases = phases.with_columns(
            pl.when(gen).then(pl.lit(rename)).otherwise(pl.col("path")).alias("path")
        )
    return dataclasses.replace(analysis, phases=phases)


# --- units ----------------------------------------------------------------------------------------


def test_units_never_raw_ns():
    table = humanize(
        "t",
        pl.DataFrame(
            {
                "step": [1],
                "gen_start_ns": [5_150_000],
                "wall_ns": [12_340_000],
                "memcpy_bytes": [18_874_368],
                "gen_busy_fraction": [0.7952],
                "energy_j": [43.3649],
                "long_start_ns": [123_456_000_000],
            }
        ),
    )
    assert [c.name for c in table.columns] == [
        "step",
        "gen_start_ms",
        "wall_ms",
        "memcpy_mb",
        "gen_busy_pct",
        "energy_j",
        "long_start_s",
    ]
    assert table.rows() == [["1", "5.15 ms", "12.34 ms", "18.87 MB", "80%", "43.36 J", "123.456 s"]]
    assert table.frame.row(0) == (1, 5.15, 12.34, 18.874368, 79.52, 43.3649, 123.456)
    assert table.notes == ["start/end: time from the start of the capture (the run's clock)"]


# --- the report -----------------------------------------------------------------------------------


def test_report_tables_have_no_ns_and_show_ms(sample):
    sections = [("Rollout stragglers", generation_tails(sample))]
    tables = report_tables(sample, sections)
    for table in tables:
        assert not [c.name for c in table.columns if c.name.endswith("_ns")], table.title
    md = to_markdown(sample, [], SAMPLES, sections)
    assert "_ns" not in md and "gen_start" not in md
    # the sample's step/gen: 24.60 ms median (p10 23.64, p90 25.29) over its 3 steps
    assert "| step/gen | window | 3 | 24.60 ms | 23.64 ms | 25.29 ms | 72% |" in md
    # rank 2000's generation starts 5.15 ms into the capture (gen_start_ns 5150000)
    stragglers = tables[1]
    first = dict(zip([c.label for c in stragglers.columns], stragglers.rows()[0], strict=True))
    assert first["gen start"] == "5.15 ms" and first["idle tail"] == "0 ms"
    assert "<td>5.15 ms</td>" in to_html(sample, [], sections)


def test_what_stands_out_on_the_sample(sample):
    findings = what_stands_out(sample, phase_summary(sample))
    assert [f.omitted for f in findings] == [False] * 4
    # the share is the median of per-step shares (39.5%), not a ratio of medians (24.60/62.58)
    assert findings[0].text == (
        "step/gen takes the most time: 24.60 ms per step (p10–p90 23.64–25.29 ms), "
        "39.5% of the step (p10–p90 37.8–40.0%); median over steps."
    )
    assert findings[1].text.startswith(
        "step/reward leaves the GPUs idlest: busy 4.6% of its 3.26 ms"
    )
    assert findings[2].text.startswith(
        "step 2 has the worst straggler: pid 2000 (GPU grpo_synthetic:0) finished generating "
        "4.40 ms after pid 2001"
    )
    assert findings[3].text == (
        "step/gen uses the largest share of the step's energy: 42.0% (p10–p90 40.3–42.7%), "
        "18.18 J per step; median over steps."
    )


def test_cpu_only_report_says_why_findings_are_missing(cpu):
    findings = what_stands_out(cpu, phase_summary(cpu))
    assert [f.omitted for f in findings] == [False, True, True, True]
    assert findings[1].text == "no GPU activity in these phases (a CPU-only capture)"
    assert "no power samples" in findings[3].text
    table = report_tables(cpu)[0]
    assert [c.label for c in table.columns] == [
        "phase path",
        "attribution",
        "steps",
        "wall time",
        "p10",
        "p90",
    ]
    assert "No GPU activity in these traces (a CPU-only capture): wall times only." in table.notes


def test_csvs_next_to_the_report_equal_its_tables(sample, tmp_path):
    sections = [("Rollout stragglers", generation_tails(sample))]
    written = write_report(sample, tmp_path, [], sections)
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert names == [
        "report.html",
        "report.md",
        "tables/phase_summary.csv",
        "tables/rollout_stragglers.csv",
    ]
    for table in report_tables(sample, sections):
        read = pl.read_csv(tmp_path / "tables" / f"{table.slug}.csv")
        assert read.equals(table.frame), table.title
    page = (tmp_path / "report.html").read_text()
    assert '<a href="tables/phase_summary.csv">' in page
    assert "(tables/rollout_stragglers.csv)" in (tmp_path / "report.md").read_text()


def test_report_escapes_names_in_html_and_markdown(sample, tmp_path):
    hostile = _with_gen_wall(sample, 1_000_000, rename=f"step/{HOSTILE} | x")
    page = to_html(hostile, [])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; | x" in page
    md = to_markdown(hostile, [], tmp_path)
    assert "<script>" not in md and "step/\\<script\\>alert(1)\\</script\\> \\| x" in md


# --- the comparison -------------------------------------------------------------------------------


def test_percent_difference_of_a_constructed_pair(sample):
    base = _with_gen_wall(sample, 8_000_000)
    other = _with_gen_wall(sample, 10_000_000)
    summary, _ = compare_runs({"a": base, "b": other})
    gen = summary.filter(
        (pl.col("path") == "step/gen") & (pl.col("metric") == "wall_ms") & (pl.col("run") == "b")
    ).row(0, named=True)
    assert (gen["median"], gen["diff"], gen["ratio"], gen["diff_pct"]) == (10.0, 2.0, 1.25, 25.0)
    # execution order: step, then its phases as they ran, each worker range after its phase
    order = (
        summary.filter(pl.col("metric") == "wall_ms")
        .unique("phase_order", keep="first", maintain_order=True)["path"]
        .to_list()
    )
    assert order[:4] == ["step", "step/gen", "generate_sequences", "step/reward"]


def test_compare_outputs_every_metric_with_percent_and_escapes(sample, tmp_path):
    base = _with_gen_wall(sample, 8_000_000, rename=f"step/{HOSTILE}")
    other = _with_gen_wall(sample, 10_000_000, rename=f"step/{HOSTILE}")
    written = write_comparison({"rule": base, "rm": other}, tmp_path)
    md = (tmp_path / "compare.md").read_text()
    titles = [line for line in md.splitlines() if line.startswith("### ")]
    assert titles == [
        "### wall time (ms)",
        "### GPU busy (projection: own launches) (%)",
        "### process GPU busy (projection) (%)",
        "### kernel time (ms)",
        "### NCCL kernel time (ms)",
        "### memcpy time (ms)",
        "### memcpy volume (MB)",
        "### energy (J)",
        "### average power (W)",
        "### energy above idle (J)",
    ]
    row = "| step/\\<script\\>alert(1)\\</script\\> | window | 8.00 (8.00–8.00) | 10.00 (10.00–10.00) | +2.00 | +25.0% |"
    assert row in md
    page = (tmp_path / "compare.html").read_text()
    assert "<script>" not in page and "step/&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("data:image/png;base64,") == 10  # no CUDA graphs: no GPU time figure
    assert "whiskers span p10–p90 over steps" in page
    csv = pl.read_csv(tmp_path / "compare.csv")
    assert {"diff_pct", "phase_order"} <= set(csv.columns)
    assert tmp_path / "compare.html" in written


def test_compare_figures_have_a_fixed_canvas(sample, tmp_path):
    small = sample.phases.filter(pl.col("path").is_in(["step", "step/gen"]))
    write_comparison(
        {"a": dataclasses.replace(sample, phases=small), "b": sample}, tmp_path / "small"
    )
    write_comparison({"a": sample, "b": sample}, tmp_path / "full")
    size = (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))
    for folder in ("small", "full"):
        with Image.open(tmp_path / folder / "figures" / "compare_wall_ms.png") as image:
            assert image.size == size
    assert (tmp_path / "full" / "figures" / "compare_wall_ms.svg").is_file()


# --- the terminal table ---------------------------------------------------------------------------


def _printed(analysis, max_rows: int = 60) -> str:
    console = Console(width=200, record=True)
    for table in phase_rich_tables(analysis, max_rows=max_rows, width=200):
        console.print(table)
    return console.export_text()


def test_terminal_groups_driver_and_workers(sample):
    text = _printed(sample, max_rows=30)
    assert "wind " not in text and " proj " not in text
    titles = re.findall(r"(driver|worker) · pid (\d+)", text)
    assert titles == [("driver", "1000"), ("worker", "2000"), ("worker", "2001")]
    # a table per scheme, each saying what its GPU columns count
    assert text.index("Phases per step") < text.index("Worker ranges per step (projection)")
    assert "GPU busy %" in text.split("Worker ranges")[0]
    assert "busy (own launches) %" in text.split("Worker ranges")[1]


def test_terminal_cpu_only_shows_dashes_and_says_why_once(cpu):
    text = _printed(cpu, max_rows=8)
    step_row = next(line for line in text.splitlines() if "│ step " in line)
    assert step_row.count("—") == 7 and "0.00" not in step_row.split("│", 4)[4]
    assert text.count("No GPU activity in these traces (CPU-only capture)") == 1
    assert "process · pid 8086" in text


# --- make report-shots ----------------------------------------------------------------------------


def test_report_shots_without_chromium_says_how_to_install(monkeypatch, tmp_path, capsys):
    from checks import report_shots

    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    page = tmp_path / "report.html"
    page.write_text("<html></html>")
    assert report_shots.main([str(page), "--out", str(tmp_path / "shots")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Chromium found") and "apt-get install chromium" in err
