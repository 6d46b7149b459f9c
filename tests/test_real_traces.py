"""Real exports from nsys 2022.4 to 2026.2: structure, versions, conservation to the ns.

Expected totals were computed with plain SQL over the same files (sqlite3 CLI), not with this code.
"""

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.errors import AnalysisError
from nvtx_phases.analysis.read.export import read_export
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import SAMPLES, shared_trace

from nvtx_phases.workload import expected_paths

NO_GPU_TABLES = [
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
]


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("local_cpu_nvtx_nsys2022.4.sqlite", "2022.4.2.1"),
        ("local_cpu_nvtx_nsys2023.4.sqlite", "2023.4.4.54"),
    ],
)
def test_cpu_exports_steps_nesting_and_missing_tables(name, version):
    path = shared_trace(name)
    raw = read_export(path)
    assert raw.nsys_version == version
    assert raw.missing_tables == NO_GPU_TABLES
    result = analyze([path])
    phases = result.phases
    assert result.summary.to_dict()["n_steps"] == 3
    assert phases.select("step", "path", "level", "attribution", "domain").rows() == [
        (step, path, level, "window", "verl")
        for step in (0, 1, 2)
        for path, level in (("step", 0), ("step/gen", 1), ("step/update_actor", 1))
    ]
    assert result.summary.to_dict()["total_gpu_ns"] == 0
    assert result.summary.to_dict()["missing_tables"] == sorted(NO_GPU_TABLES)
    # every NVTX range is read: 3 × (step, gen, update_actor, push/pop, start/end)
    assert result.summary.to_dict()["n_ranges"] == 15
    everything = analyze([path], phase_map=default_phase_map().with_all_ranges()).phases
    counts = everything.group_by("path").agg(pl.col("n_ranges").sum())
    assert dict(counts.rows()) == {
        "step": 3,
        "step/gen": 3,
        "step/update_actor": 3,
        "pushpop_default": 3,
        "startend_range": 3,
    }
    # they lie between steps: one row with no step index holds all three
    assert everything.filter(pl.col("path") == "pushpop_default").select(
        "step", "n_ranges"
    ).rows() == [(None, 3)]


def test_recorded_sample_has_exactly_the_workload_structure():
    result = analyze([SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"])
    counts = result.phases.group_by("path").agg(pl.col("n_ranges").sum())
    assert dict(counts.rows()) == dict(expected_paths(3))
    assert sorted(result.phases["step"].unique().to_list()) == [1, 2, 3]  # from the category
    assert result.phases["domain"].unique().to_list() == ["nvtx_phases"]
    levels = dict(result.phases.select("path", "level").unique().rows())
    assert levels["step/update_actor/micro_batch/backward"] == 3


@pytest.mark.parametrize(
    ("name", "total_ns", "n_kernels", "n_nccl", "memcpy_bytes", "n_devices"),
    [
        ("nsysai_h100_2gpu_1s.sqlite", 1_925_700_952, 3442, 0, 110_318_980_178, 2),
        ("nsysai_mfu_2gpu_before.sqlite", 541_106_145, 4010, 66, 8_046_134_544, 2),
        ("pipit_cloverleaf_4xA100_nsys2024.5.sqlite", 303_795_463, 1312, 0, None, 1),
    ],
)
def test_gpu_exports_conserve_gpu_time_to_the_ns(
    name, total_ns, n_kernels, n_nccl, memcpy_bytes, n_devices
):
    result = analyze([shared_trace(name)], phase_map=default_phase_map().with_all_ranges())
    s = result.summary.to_dict()
    assert s["total_gpu_ns"] == total_ns
    assert s["attributed_gpu_ns"] + s["unattributed_gpu_ns"] == total_ns
    assert s["projection_attributed_gpu_ns"] + s["projection_unattributed_gpu_ns"] == total_ns
    assert s["n_kernels"] == n_kernels
    assert s["n_devices"] == n_devices
    assert int((result.gpu_activity.collect()["op_class"] == "nccl").sum()) == n_nccl
    if memcpy_bytes is not None:
        assert s["memcpy_bytes"] == memcpy_bytes
    assert result.kernels["count"].sum() == n_kernels


def test_export_without_nvtx_puts_everything_in_unattributed():
    result = analyze([shared_trace("pipit_cloverleaf_4xA100_nsys2024.5.sqlite")])
    s = result.summary.to_dict()
    assert s["missing_tables"] == ["CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS"]
    assert s["attributed_gpu_ns"] == 0
    assert s["unattributed_gpu_ns"] == 303_795_463
    assert result.phases.height == 0
    activity = result.gpu_activity.collect()
    assert activity["window_path"].null_count() == activity.height


def test_cut_trace_reports_kernels_without_launch_calls():
    result = analyze([shared_trace("nsysai_mfu_2gpu_before.sqlite")])
    assert any(
        "31 of 5299 GPU operation(s) have no matching CUDA API call" in w for w in result.warnings
    )


def test_clock_zero_of_an_export_stamped_with_the_host_clock():
    """nsys 2026.2 stamps events with the host clock and states its reading at the start."""
    raw = read_export(shared_trace("nsysai_h100_2gpu_1s.sqlite"))
    assert raw.session_start_utc_ns == 1_779_630_014_975_716_426
    assert raw.clock_zero_utc_ns == 1_779_630_014_975_716_426 - 35_255_823_190
    older = read_export(shared_trace("pipit_cloverleaf_4xA100_nsys2024.5.sqlite"))
    assert older.clock_zero_utc_ns == older.session_start_utc_ns == 1_696_392_839_587_175_550


def test_ranges_that_are_no_phase_say_what_to_do():
    result = analyze([shared_trace("nsysai_h100_2gpu_1s.sqlite")], power_files=[])
    assert result.phases.height == 0
    [warning] = [w for w in result.warnings if "none is a known phase" in w]
    assert warning.startswith("16782 NVTX range(s) (e.g. ")
    assert warning.endswith("pass --all-ranges, or --phase-map FILE.toml naming yours")


def test_nvtx_with_domain_events_only_names_the_fix(tmp_path):
    """What current `nvtx` under nsys 2022.4/2023.4 leaves: domain events, no range."""
    import shutil
    import sqlite3

    path = tmp_path / "domains_only.sqlite"
    shutil.copy(shared_trace("local_cpu_nvtx_nsys2022.4.sqlite"), path)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM NVTX_EVENTS WHERE eventType != 75")
    with pytest.raises(AnalysisError) as raised:
        analyze([path], power_files=[])
    assert str(raised.value) == (
        "nothing to analyze: domains_only: NVTX holds domain events but no range: this nsys did "
        "not record the ranges of the Python nvtx package in use (nsys 2022.4/2023.4 with nvtx "
        ">= 0.2.9); install nvtx==0.2.8 in the traced environment, or capture with a newer nsys"
    )
