"""``kernels_by_phase.csv``: kernel time per name inside each phase, against brute force.

The sample's numbers are recomputed here from the raw export with sqlite3 and plain Python,
independently of the analysis: window phases clip every kernel to the driver range's interval
by hand; projection phases take whole kernels whose launching call lies inside a range on the
same thread (NVIDIA's definition), which ``nsys stats -r nvtxkernsum`` also gives.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.aggregate.kernels_by_phase import SCHEMA, kernels_by_phase
from nvtx_phases.analysis.render.report.document import to_html, to_markdown
from nvtx_phases.analysis.render.report.kernels import read_kernels_by_phase, top_kernels_section
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray
from nvtxp_testkit import SAMPLES, find_nsys_or_skip

SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
DRIVER_DOMAIN = 1  # the sample's driver marks its phases in domain "verl"

Totals = dict[tuple, list[int]]  # (step, path, name) -> [count, total_ns]


def _raw(path: Path) -> tuple[list[tuple], list[tuple], dict[int, tuple[int, int]]]:
    """Ranges ``(start, end, name, gtid, domain, payload)``, kernels ``(start, end, name, pid,
    correlationId)`` and launch calls ``(pid, correlationId) -> (gtid, start, end)``."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(con.execute("SELECT id, value FROM StringIds"))
    ranges = [
        (start, end, text if text is not None else strings[text_id], gtid, domain, payload)
        for start, end, text, text_id, gtid, domain, payload in con.execute(
            "SELECT start, end, text, textId, globalTid, domainId, int64Value FROM NVTX_EVENTS "
            "WHERE eventType = 59"
        )
    ]
    kernels = [
        (start, end, strings[name], (gpid >> 24) & 0xFFFFFF, corr)
        for start, end, name, gpid, corr in con.execute(
            "SELECT start, end, demangledName, globalPid, correlationId "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL"
        )
    ]
    calls = {
        ((gtid >> 24) & 0xFFFFFF, corr): (gtid, start, end)
        for start, end, gtid, corr in con.execute(
            "SELECT start, end, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        )
    }
    con.close()
    return ranges, kernels, calls


def _steps(ranges: list[tuple]) -> list[tuple[int, int, int]]:
    return sorted((s, e, p) for s, e, name, _, _, p in ranges if name == "step")


def _step_of(start: int, steps: list[tuple[int, int, int]]) -> int | None:
    return next((p for s, e, p in steps if s <= start < e), None)


def brute_window(path: Path) -> Totals:
    """Every kernel clipped to each driver range (paths: ``step`` and ``step/<name>``)."""
    ranges, kernels, _ = _raw(path)
    steps = _steps(ranges)
    totals: Totals = defaultdict(lambda: [0, 0])
    for start, end, name, _, domain, _ in ranges:
        if domain != DRIVER_DOMAIN:
            continue
        key_path = "step" if name == "step" else f"step/{name}"
        step = _step_of(start, steps)
        for k_start, k_end, k_name, _, _ in kernels:
            overlap = min(k_end, end) - max(k_start, start)
            if overlap > 0:
                totals[(step, key_path, k_name)][0] += 1
                totals[(step, key_path, k_name)][1] += overlap
    return dict(totals)


def brute_projection(path: Path) -> Totals:
    """Whole kernels whose launch call lies inside a worker range on the launching thread."""
    ranges, kernels, calls = _raw(path)
    steps = _steps(ranges)
    totals: Totals = defaultdict(lambda: [0, 0])
    for start, end, name, gtid, domain, _ in ranges:
        if domain == DRIVER_DOMAIN:
            continue
        step = _step_of(start, steps)
        for k_start, k_end, k_name, pid, corr in kernels:
            c_gtid, c_start, c_end = calls[(pid, corr)]
            if c_gtid == gtid and start <= c_start and c_end <= end:
                totals[(step, name, k_name)][0] += 1
                totals[(step, name, k_name)][1] += k_end - k_start
    return dict(totals)


def _over_steps(totals: Totals) -> Totals:
    summed: Totals = defaultdict(lambda: [0, 0])
    for (_, path, name), (count, total) in totals.items():
        summed[(None, path, name)][0] += count
        summed[(None, path, name)][1] += total
    return dict(summed)


def _ours(table: pl.DataFrame, attribution: str, scope: str) -> Totals:
    rows = table.filter((pl.col("attribution") == attribution) & (pl.col("scope") == scope))
    return {
        (r["step"], r["path"], r["name"]): [r["count"], r["total_ns"]]
        for r in rows.iter_rows(named=True)
    }


@pytest.fixture(scope="module")
def sample():
    with analyze([SAMPLE]) as result:
        yield result, kernels_by_phase(result.gpu_activity, result.phases, top=None)


@pytest.mark.parametrize("scope", ["step", "all"])
def test_window_kernels_equal_hand_clipping(sample, scope):
    _, table = sample
    truth = brute_window(SAMPLE)
    assert _ours(table, "window", scope) == (truth if scope == "step" else _over_steps(truth))


@pytest.mark.parametrize("scope", ["step", "all"])
def test_projection_kernels_equal_brute_force(sample, scope):
    _, table = sample
    truth = brute_projection(SAMPLE)
    assert _ours(table, "projection", scope) == (truth if scope == "step" else _over_steps(truth))


def test_generation_phase_known_numbers(sample):
    _, table = sample
    gen = table.filter(
        (pl.col("path") == "step/gen") & (pl.col("scope") == "all") & (pl.col("rank") == 1)
    )
    assert gen.select("name", "count", "total_ns", "phase_kernel_ns").row(0) == (
        "void cutlass::Kernel<gemm_bf16>(Params)",
        63,
        27_467_211,
        104_962_565,
    )
    # the generation kernel that straddles gen's end counts 1.5 ms less clipped than whole
    workers = table.filter(
        (pl.col("path") == "generate_sequences") & (pl.col("scope") == "all")
    ).filter(pl.col("rank") == 1)
    assert workers["total_ns"].item() - gen["total_ns"].item() == 1_500_000


def test_phase_totals_equal_the_phase_table(sample):
    result, table = sample
    ours = (
        table.filter(pl.col("scope") == "step")
        .group_by("attribution", "step", "path")
        .agg(pl.col("phase_kernel_ns").first(), pl.col("share_pct").sum())
    )
    assert ((ours["share_pct"] - 100).abs() < 1e-9).all()
    theirs = (
        result.phases.group_by("attribution", "step", "path")
        .agg((pl.col("kernel_ns") + pl.col("graph_ns")).sum().alias("phase_kernel_ns"))
        .filter(pl.col("phase_kernel_ns") > 0)
    )
    key = ["attribution", "step", "path"]
    assert ours.drop("share_pct").sort(key).equals(theirs.sort(key))


def test_top_n_ranks_by_time(sample):
    result, full = sample
    top2 = kernels_by_phase(result.gpu_activity, result.phases, top=2)
    assert top2["rank"].max() == 2
    expected = full.filter(pl.col("rank") <= 2)
    assert top2.equals(expected)
    for _, rows in full.group_by("attribution", "scope", "step", "path"):
        ranked = rows.sort("rank")
        assert ranked["total_ns"].to_list() == sorted(ranked["total_ns"], reverse=True)
        assert ranked["rank"].to_list() == list(range(1, ranked.height + 1))
    assert (full["mean_ns"] * full["count"] - full["total_ns"]).abs().max() < 1e-6


def test_projection_equals_nsys_nvtxkernsum(sample, tmp_path):
    nsys = find_nsys_or_skip()
    copy = tmp_path / SAMPLE.name  # nsys stats may add tables: never touch the sample
    copy.write_bytes(SAMPLE.read_bytes())
    subprocess.run(
        [nsys, "stats", "-q", "-r", "nvtxkernsum", "-f", "csv", "-o", str(tmp_path / "s"), copy],
        check=True,
        capture_output=True,
        timeout=300,
    )
    theirs = (
        pl.read_csv(tmp_path / "s_nvtxkernsum.csv", infer_schema_length=0)
        .filter(pl.col("NVTX Range") != "None")
        .group_by(pl.col("NVTX Range").alias("path"), pl.col("Kernel Name").alias("name"))
        .agg(
            pl.col("Kern Inst").cast(pl.Int64).sum().alias("count"),
            pl.col("Total Time (ns)").cast(pl.Int64).sum().alias("total_ns"),
        )
        .sort("path", "name")
    )
    _, table = sample
    ours = (
        table.filter((pl.col("attribution") == "projection") & (pl.col("scope") == "all"))
        .select("path", "name", "count", "total_ns")
        .sort("path", "name")
    )
    assert ours.equals(theirs)


@pytest.fixture(scope="module")
def ray_files(tmp_path_factory):
    return generate_ray(tmp_path_factory.mktemp("ray"), RayConfig())


def test_cuda_graphs_and_buckets(ray_files, tmp_path):
    """Graph executions are kernels here; a spilled run (activity in Parquet parts) agrees."""
    with (
        analyze(ray_files) as whole,
        analyze(ray_files, chunk_ops=200, spill_dir=tmp_path) as spilled,
    ):
        assert spilled.workdir is not None  # gpu_activity is a lazy scan of Parquet parts
        table = kernels_by_phase(whole.gpu_activity, whole.phases, top=None)
        assert table.equals(kernels_by_phase(spilled.gpu_activity, spilled.phases, top=None))
        graphs = table.filter(pl.col("op_class") == "cuda_graph")
        assert graphs.height > 0
        totals = (
            table.filter(pl.col("scope") == "all")
            .group_by("attribution", "path")
            .agg(pl.col("phase_kernel_ns").first())
            .sort("attribution", "path")
        )
        phases = (
            whole.phases.group_by("attribution", "path")
            .agg((pl.col("kernel_ns") + pl.col("graph_ns")).sum().alias("phase_kernel_ns"))
            .filter(pl.col("phase_kernel_ns") > 0)
            .sort("attribution", "path")
        )
        assert totals.equals(phases)


# --- hand-made frames: overlapping processes, nesting, names with "/" --------------------------


def _activity(*ops: tuple) -> pl.LazyFrame:
    """(name, start, end, projection_step, projection_path) kernel rows."""
    return pl.DataFrame(
        [("kernel", "compute", n, s, e, e - s, ps, pp, None) for n, s, e, ps, pp in ops],
        schema={
            "kind": pl.String,
            "op_class": pl.String,
            "name": pl.String,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "dur_ns": pl.Int64,
            "projection_step": pl.Int64,
            "projection_path": pl.String,
            "window_step": pl.Int64,
        },
        orient="row",
    ).lazy()


def _phases(*rows: tuple) -> pl.DataFrame:
    """(pid, step, path, attribution, start, end) phase rows."""
    return pl.DataFrame(
        list(rows),
        schema={
            "pid": pl.Int64,
            "step": pl.Int64,
            "path": pl.String,
            "attribution": pl.String,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )


def test_window_union_over_processes_and_clipping():
    # two drivers mark gen over overlapping spans: their union [0, 150), counted once
    phases = _phases(
        (1, 1, "step", "window", 0, 300),
        (1, 1, "step/gen", "window", 0, 100),
        (2, 1, "step/gen", "window", 50, 150),
        (1, None, "testing", "window", 400, 500),
    )
    activity = _activity(
        ("a", 90, 200, None, None), ("b", 120, 130, None, None), ("a", 450, 600, None, None)
    )
    table = kernels_by_phase(activity, phases, top=None).filter(pl.col("scope") == "step")
    got = {
        (r["step"], r["path"], r["name"]): (r["count"], r["total_ns"])
        for r in table.iter_rows(named=True)
    }
    assert got == {
        (1, "step", "a"): (1, 110),
        (1, "step", "b"): (1, 10),
        (1, "step/gen", "a"): (1, 60),  # 90..150 of 90..200
        (1, "step/gen", "b"): (1, 10),
        (None, "testing", "a"): (1, 50),  # a phase outside any step keeps step null
    }


def test_projection_counts_enclosing_phases_and_keeps_slashes_in_names():
    phases = _phases(
        (1, 1, "update_actor", "projection", 0, 100),
        (1, 1, "update_actor/fwd/bwd", "projection", 0, 50),  # one phase named "fwd/bwd"
    )
    activity = _activity(("k", 10, 20, 1, "update_actor/fwd/bwd"), ("k", 60, 70, 1, "update_actor"))
    table = kernels_by_phase(activity, phases, top=None).filter(pl.col("scope") == "all")
    got = {r["path"]: (r["count"], r["total_ns"]) for r in table.iter_rows(named=True)}
    assert got == {"update_actor": (2, 20), "update_actor/fwd/bwd": (1, 10)}


def test_no_kernels_or_no_activity_columns_is_an_empty_table():
    phases = _phases((1, 1, "step", "window", 0, 100))
    empty = kernels_by_phase(pl.LazyFrame(), phases)
    assert empty.schema == pl.Schema(SCHEMA) and empty.height == 0
    assert kernels_by_phase(_activity(), phases).height == 0


# --- the CSV and the report section ----------------------------------------------------------------


def test_csv_round_trip_and_escaped_report_section(sample, tmp_path):
    result, table = sample
    hostile = table.with_columns(
        pl.when(pl.col("rank") == 1)
        .then(pl.lit("<script>alert('x')</script> | kernel"))
        .otherwise(pl.col("name"))
        .alias("name")
    )
    hostile.write_csv(tmp_path / "kernels_by_phase.csv")
    read = read_kernels_by_phase(tmp_path)
    assert read is not None and read.equals(hostile)
    section = top_kernels_section(read)
    assert section is not None
    title, frame = section
    assert frame["phase path"].unique(maintain_order=True).len() == 5
    assert frame.group_by("phase path").len()["len"].max() == 5
    page = to_html(result, [], [section])
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    md = to_markdown(result, [], tmp_path, [section])
    assert "\\| kernel" in md and title in md
    assert read_kernels_by_phase(tmp_path / "nowhere") is None


def test_report_shows_the_section_from_a_folder_and_copes_without_it(tmp_path):
    from nvtx_phases.analysis.cli import app
    from typer.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "run"
    done = runner.invoke(app, ["analyze", str(SAMPLE), "--out", str(out), "-q", "--no-figures"])
    assert done.exit_code == 0, done.output
    table = pl.read_csv(out / "kernels_by_phase.csv")
    assert table["rank"].max() == 7  # the sample has 7 kernel names, fewer than the top 10
    done = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep")])
    assert done.exit_code == 0, done.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Top kernels per phase (all steps;" in md
    done = runner.invoke(app, ["report", str(out), "--steps", "2", "--out", str(tmp_path / "sel")])
    assert done.exit_code == 0, done.output
    assert (
        "## Top kernels per phase (the selected steps;"
        in (tmp_path / "sel" / "report.md").read_text()
    )
    # human units; "<" escaped for Markdown (a range name could be raw HTML)
    assert (
        "| step/gen | window | 105.0 ms | 1 | void cutlass::Kernel\\<gemm_bf16\\>(Params) |" in md
    )
    (out / "kernels_by_phase.csv").unlink()  # a folder from before the table: computed from
    done = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep2")])  # activity
    assert done.exit_code == 0, done.output
    assert (tmp_path / "rep2" / "report.md").read_text().count(
        "| step/gen | window | 105.0 ms | 1 | void cutlass::Kernel\\<gemm_bf16\\>(Params) |"
    ) == 1
    (out / "gpu_activity.parquet").unlink()  # neither table: no section, no error
    done = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "rep3")])
    assert done.exit_code == 0, done.output
    assert "Top kernels per phase" not in (tmp_path / "rep3" / "report.md").read_text()
