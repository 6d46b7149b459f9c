"""Properties on random runs (hypothesis): GPU time is conserved to the ns under both schemes,
and results do not depend on input row order or on how a run is split across files."""

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.normalize.events import OPS_SCHEMA, RANGES_SCHEMA, RUNTIME_SCHEMA
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtxp_testkit import attribute_run

DRIVER, WORKER0 = 100, 200
PHASES = ("gen", "reward", "old_log_prob", "update_actor")
WORKER_NAME = {
    "gen": "generate_sequences",
    "old_log_prob": "compute_log_prob",
    "update_actor": "update_actor",
}
KINDS = [("kernel", "compute"), ("kernel", "nccl"), ("memcpy", "memcpy_h2d"), ("memset", "memset")]


def gtid(pid):
    return (1 << 48) | (pid << 24) | pid


@st.composite
def random_runs(draw):
    n_steps = draw(st.integers(1, 3))
    n_ranks = draw(st.integers(1, 3))
    ranges, ops, calls = [], [], []
    corr = {r: 0 for r in range(n_ranks)}
    t = draw(st.integers(0, 1_000))
    for step in range(1, n_steps + 1):
        step_start = t
        for name in PHASES:
            start = t + draw(st.integers(0, 50))
            end = start + draw(st.integers(0, 2_000))  # zero-length phases too
            ranges.append((DRIVER, start, end, name, None))
            if name in WORKER_NAME:
                for rank in range(n_ranks):
                    w_start = start + draw(st.integers(0, 20))
                    w_end = max(w_start, end - draw(st.integers(0, 20)))
                    ranges.append((WORKER0 + rank, w_start, w_end, WORKER_NAME[name], None))
                    for _ in range(draw(st.integers(0, 4))):
                        kind, cls = draw(st.sampled_from(KINDS))
                        op_start = draw(st.integers(w_start - 100, w_end + 100))
                        op_end = op_start + draw(
                            st.integers(0, 800)
                        )  # may straddle phases and steps
                        call = draw(st.integers(w_start - 30, w_end))  # some launches fall outside
                        corr[rank] += 1
                        ops.append((WORKER0 + rank, rank, kind, cls, op_start, op_end, corr[rank]))
                        calls.append(
                            (WORKER0 + rank, call, call + draw(st.integers(0, 10)), corr[rank])
                        )
            t = end + draw(st.integers(0, 30))
        ranges.append((DRIVER, step_start, t, "step", step))
        t += draw(st.integers(0, 200))
    return ranges, ops, calls


def frames(run):
    ranges, ops, calls = run
    r = pl.DataFrame(
        [
            {
                "trace": "t",
                "gtid": gtid(pid),
                "pid": pid,
                "tid": pid,
                "start_ns": s,
                "end_ns": e,
                "name": n,
                "domain": "",
                "pushpop": True,
                "payload": p,
            }
            for pid, s, e, n, p in ranges
        ],
        schema=RANGES_SCHEMA,
    )
    o = pl.DataFrame(
        [
            {
                "trace": "t",
                "gpid": gtid(pid) & ~0xFFFFFF,
                "pid": pid,
                "device": str(dev),
                "stream": 7,
                "kind": kind,
                "op_class": cls,
                "name": cls,
                "start_ns": s,
                "end_ns": e,
                "bytes": 64 if kind == "memcpy" else 0,
                "correlation_id": c,
            }
            for pid, dev, kind, cls, s, e, c in ops
        ],
        schema=OPS_SCHEMA,
    )
    c = pl.DataFrame(
        [
            {
                "trace": "t",
                "gtid": gtid(pid),
                "pid": pid,
                "start_ns": s,
                "end_ns": e,
                "correlation_id": cid,
            }
            for pid, s, e, cid in calls
        ],
        schema=RUNTIME_SCHEMA,
    )
    return r, o, c


def run_core(r, o, c):
    o = o.with_row_index("op_id").with_columns(pl.col("op_id").cast(pl.Int64))
    return attribute_run(r, o, c, default_phase_map())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_runs())
def test_gpu_time_is_conserved_to_the_ns(run):
    result = run_core(*frames(run))
    s = result.summary.to_dict()
    total = sum(e - s_ for _, _, _, _, s_, e, _ in run[1])
    assert s["total_gpu_ns"] == total
    assert s["attributed_gpu_ns"] + s["unattributed_gpu_ns"] == total
    assert s["projection_attributed_gpu_ns"] + s["projection_unattributed_gpu_ns"] == total
    assert 0 <= s["attributed_gpu_ns"] <= total
    # every window phase's GPU time fits in its wall time × devices, busy ≤ kernel+copy+set time
    window = result.phases.filter(pl.col("attribution") == "window")
    assert (window["gpu_busy_ns"] <= window["wall_ns"] * window["n_devices"]).all()
    assert (
        window["gpu_busy_ns"] <= window["kernel_ns"] + window["memcpy_ns"] + window["memset_ns"]
    ).all()
    assert (window["idle_ns"] >= 0).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_runs(), st.randoms(use_true_random=False))
def test_results_do_not_depend_on_row_order(run, rnd):
    r, o, c = frames(run)
    shuffled = [
        frame.sample(fraction=1.0, shuffle=True, seed=rnd.randint(0, 2**31)) for frame in (r, o, c)
    ]
    a, b = run_core(r, o, c), run_core(*shuffled)
    keys = ["trace", "pid", "step", "path", "phase", "attribution"]
    assert a.phases.sort(keys, nulls_last=True).equals(b.phases.sort(keys, nulls_last=True))
    for key in ("total_gpu_ns", "attributed_gpu_ns", "projection_attributed_gpu_ns", "n_steps"):
        assert a.summary.to_dict()[key] == b.summary.to_dict()[key]


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1000))
def test_splitting_a_run_across_files_changes_nothing(tmp_path_factory, steps, ranks, seed):
    folder = tmp_path_factory.mktemp("split")
    cfg = SynthConfig(
        steps=steps, ranks=ranks, kernels_per_phase=3, seed=seed, power=False, lengths=False
    )
    one = analyze(generate(folder / "one.sqlite", cfg))
    many = analyze(generate(folder / "split", SynthConfig(**{**cfg.__dict__, "split_files": True})))
    cols = [
        "pid",
        "step",
        "path",
        "attribution",
        "start_ns",
        "wall_ns",
        "kernel_ns",
        "gpu_busy_ns",
        "nccl_ns",
    ]
    key = ["pid", "step", "path", "attribution"]
    assert many.phases.select(cols).sort(key).equals(one.phases.select(cols).sort(key))
    assert many.summary.to_dict()["attributed_gpu_ns"] == one.summary.to_dict()["attributed_gpu_ns"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_runs(), st.lists(st.integers(-10, 15_000), max_size=6))
def test_results_do_not_depend_on_bucket_edges(run, edges):
    r, o, c = frames(run)
    o = o.with_row_index("op_id").with_columns(pl.col("op_id").cast(pl.Int64))
    a = attribute_run(r, o, c, default_phase_map())
    b = attribute_run(r, o, c, default_phase_map(), edges=edges)
    assert a.phases.equals(b.phases)
    assert a.phase_devices.equals(b.phase_devices)
    assert a.gpu_activity.collect().sort("op_id").equals(b.gpu_activity.collect().sort("op_id"))
    assert a.kernels.equals(b.kernels)
    assert a.summary == b.summary


@st.composite
def tangled_runs(draw):
    """One worker thread with start/end ranges that overlap at random (nesting or not), and
    launches inside, across and outside them."""
    names = ("update_actor", "compute_log_prob", "compute_values", "generate_sequences")
    ranges = []
    for _ in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, 400))
        ranges.append((start, start + draw(st.integers(0, 300)), draw(st.sampled_from(names))))
    ops = []
    for corr in range(1, draw(st.integers(1, 12)) + 1):
        call = draw(st.integers(-20, 720))
        op_start = call + draw(st.integers(0, 50))
        ops.append(
            (call, call + draw(st.integers(0, 40)), op_start, draw(st.integers(0, 60)), corr)
        )
    return ranges, ops


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tangled_runs(), st.lists(st.integers(0, 800), max_size=3))
def test_projection_of_ranges_that_do_not_nest_equals_brute_force(run, edges):
    ranges, ops = run
    pid = WORKER0
    r = pl.DataFrame(
        [
            {"trace": "t", "gtid": gtid(pid), "pid": pid, "tid": pid, "start_ns": s, "end_ns": e}
            | {"name": n, "domain": "", "pushpop": False, "payload": None}
            for s, e, n in ranges
        ],
        schema=RANGES_SCHEMA,
    )
    o = pl.DataFrame(
        [
            {"trace": "t", "gpid": gtid(pid) & ~0xFFFFFF, "pid": pid, "device": "0", "stream": 7}
            | {"kind": "kernel", "op_class": "compute", "name": "k", "start_ns": s}
            | {"end_ns": s + d, "bytes": 0, "correlation_id": corr}
            for _, _, s, d, corr in ops
        ],
        schema=OPS_SCHEMA,
    ).with_row_index("op_id")
    c = pl.DataFrame(
        [
            {"trace": "t", "gtid": gtid(pid), "pid": pid, "start_ns": cs, "end_ns": ce}
            | {"correlation_id": corr}
            for cs, ce, _, _, corr in ops
        ],
        schema=RUNTIME_SCHEMA,
    )
    o = o.with_columns(pl.col("op_id").cast(pl.Int64))
    result = attribute_run(r, o, c, default_phase_map(), edges=edges)
    # NVIDIA's definition, by brute force: a range encloses the launching call
    enclosed = [any(s <= cs and e >= ce for s, e, _ in ranges) for cs, ce, _, _, _ in ops]
    held = sum(d for (_, _, _, d, _), inside in zip(ops, enclosed, strict=True) if inside)
    gpu = result.summary.gpu
    assert gpu.gpu_time_conserved, result.warnings
    assert gpu.projection_attributed_gpu_ns == held
    assert gpu.projection_unattributed_gpu_ns == sum(d for _, _, _, d, _ in ops) - held
    activity = result.gpu_activity.collect().sort("op_id")
    assert activity["projection_path"].is_not_null().to_list() == enclosed
    # every range holds exactly the operations it encloses, whole (rows add ranges of a path)
    per_range = [sum(d for cs, ce, _, d, _ in ops if s <= cs and e >= ce) for s, e, _ in ranges]
    assert result.phases["kernel_ns"].sum() == sum(per_range)
