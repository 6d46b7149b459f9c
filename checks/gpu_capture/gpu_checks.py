"""Checks that need a GPU capture: kernels traced, one physical GPU, CUDA events, graphs, energy.

Each compares the analysis' phase table with a clock or counter the run read itself: the
workers' CUDA events (``events.json``), the torch UUID of device 0, the driver's own reads of
the GPU's energy counter (``counter_reads.json``, with ``checks.gpu_check``'s tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from checks.gpu_capture.model import CUDA_EVENT_RESOLUTION_NS, PHASE_WORK, Config
from checks.gpu_check.environment import normalize_gpu_uuid
from checks.gpu_check.model import FAIL, INFO, PASS, Check
from checks.gpu_check.project import load_samples
from checks.gpu_check.reads import counter_period, end_resolution_j, reads_by_phase
from checks.gpu_check.timeline import select_device, update_period_ms


@dataclass
class ModeRun:
    """What one mode's analysis and run files hold (the frames the checks read)."""

    mode: str
    phases: pl.DataFrame
    ranges: pl.DataFrame
    devices: list[dict[str, Any]]
    events: dict[str, Any]
    recorder: pl.DataFrame
    power: Path | None = None
    reads: list[dict[str, Any]] = field(default_factory=list)

    def worker_rows(self, role: str, op: str) -> pl.DataFrame:
        """The projection rows of a worker's range, one per step ≥ 1."""
        pid = self.events["hellos"][role]["pid"]
        return self.phases.filter(
            (pl.col("pid") == pid) & (pl.col("attribution") == "projection")
            & (pl.col("path") == op) & (pl.col("step") >= 1)
        ).sort("step")  # fmt: skip

    def reply(self, role: str, op: str, step: int) -> dict[str, Any]:
        """The worker's timed reply for one command."""
        return next(
            r for r in self.events["replies"]
            if r["role"] == role and r["op"] == op and r["step"] == step
        )  # fmt: skip


def check_kernels_traced(run: ModeRun) -> Check:
    """CUPTI in this nsys traced the device's CUDA: GPU work in both workers' ranges."""
    counts = {}
    for role in ("rollout", "trainer"):
        pid = run.events["hellos"][role]["pid"]
        rows = run.phases.filter((pl.col("pid") == pid) & (pl.col("attribution") == "projection"))
        counts[role] = int(rows.select(pl.col("n_kernels").sum() + pl.col("n_graphs").sum()).item())
    ok = all(counts.values())
    detail = ", ".join(f"{r}: {n} kernels + graph executions" for r, n in counts.items())
    return Check(run.mode, "GPU work traced (CUPTI vs the device's CUDA)", PASS if ok else FAIL,
                 detail)  # fmt: skip


def check_one_gpu(run: ModeRun) -> Check:
    """Rollout and trainer (separate reports, each device 0) on one physical GPU, torch's UUID."""
    torch_uuids = {
        normalize_gpu_uuid(h.get("uuid")) or normalize_gpu_uuid(h.get("uuid_hex"))
        for h in run.events["hellos"].values()
    }
    devs = [d for d in run.devices if set(d.get("traces", [])) & {"rollout", "trainer"}]
    named = {normalize_gpu_uuid(d.get("uuid")) for d in devs}
    users = sorted(t for d in devs for t in d.get("traces", []))
    ok = len(devs) == 1 and named == torch_uuids and {"rollout", "trainer"} <= set(users)
    detail = (
        f"analysis: {len(devs)} GPU(s) {[d['device'] for d in devs]} identified by "
        f"{[d.get('identity') for d in devs]}, used by {users}; trace UUID {sorted(map(str, named))}"
        f" vs torch {sorted(map(str, torch_uuids))}"
    )
    return Check(run.mode, "one physical GPU (UUID) for both workers", PASS if ok else FAIL, detail)


def check_events(run: ModeRun, cfg: Config) -> list[Check]:
    """GPU span of each worker range and each one-worker driver phase vs its CUDA events.

    The events bracket the command's GPU work on its stream: elapsed ≥ the traced span of its
    operations, by the time between an event and the next/previous kernel (µs).
    """
    rows = []
    driver = run.phases.filter(
        (pl.col("pid") == run.events["driver_pid"]) & (pl.col("attribution") == "window")
    )
    for name, work in PHASE_WORK.items():
        for role, op in work:
            for r in run.worker_rows(role, op).iter_rows(named=True):
                elapsed = run.reply(role, op, r["step"])["elapsed_ns"]
                rows.append(_span_row(f"{role}:{op}", r, elapsed))
                if len(work) == 1:  # a driver phase whose GPU work one process did
                    d = driver.filter((pl.col("path") == f"step/{name}")
                                      & (pl.col("step") == r["step"]))  # fmt: skip
                    if d.height == 1:
                        rows.append(_span_row(f"driver:{name}", d.row(0, named=True), elapsed))
    if not rows:
        return [Check(run.mode, "GPU span vs CUDA events", FAIL, "no ranges with GPU work")]
    tol = cfg.tol_events_ns + 2 * CUDA_EVENT_RESOLUTION_NS
    bad = [r for r in rows if r["span_ns"] is None or not -2 * CUDA_EVENT_RESOLUTION_NS
           <= r["elapsed_ns"] - r["span_ns"] <= tol]  # fmt: skip
    worst = max(rows, key=lambda r: abs(r["elapsed_ns"] - (r["span_ns"] or 0)))
    detail = (
        f"{len(rows) - len(bad)}/{len(rows)} ranges: 0 ≤ events − span ≤ {tol / 1e3:.1f} µs; "
        f"worst {worst['what']} step {worst['step']}: span {_ms(worst['span_ns'])} vs events "
        f"{_ms(worst['elapsed_ns'])}"
    )
    busy = sum(r["busy_ns"] or 0 for r in rows) / max(1, sum(r["elapsed_ns"] for r in rows))
    return [
        Check(run.mode, "GPU span vs CUDA events", FAIL if bad else PASS, detail),
        Check(run.mode, "GPU busy / CUDA-event time", INFO, f"{busy:.1%} over those ranges"),
    ]


def _span_row(what: str, row: dict[str, Any], elapsed: int) -> dict[str, Any]:
    start, end = row.get("gpu_start_ns"), row.get("gpu_end_ns")
    span = None if start is None or end is None else end - start
    return {"what": what, "step": row["step"], "span_ns": span, "elapsed_ns": elapsed,
            "busy_ns": row.get("gpu_busy_ns")}  # fmt: skip


def _ms(ns: float | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:.3f} ms"


def check_graph_vs_node(graph: ModeRun, node: ModeRun, cfg: Config) -> Check:
    """Per step: graph executions' time (graph capture) vs the replays' kernels (node capture).

    The two captures ran the same replays; the node capture's own CUDA events say how much of
    a replay is not kernel time (gaps inside and between replays): the allowed difference.
    """
    g = graph.worker_rows("rollout", "generate_sequences")
    n = node.worker_rows("rollout", "generate_sequences")
    tokens = int(graph.events["sizes"]["tokens"])
    lines, bad = [], 0
    for a, b in zip(g.iter_rows(named=True), n.iter_rows(named=True), strict=False):
        replays = sum(node.reply("rollout", "generate_sequences", b["step"])["replays_ns"])
        overhead = max(0, replays - b["kernel_ns"])
        allowed = overhead + cfg.tol_graph * b["kernel_ns"]
        diff = a["graph_ns"] - b["kernel_ns"]
        ok = a["n_graphs"] == tokens and b["n_graphs"] == 0 and abs(diff) <= allowed
        bad += not ok
        lines.append(
            f"step {a['step']}: {a['n_graphs']} graphs {_ms(a['graph_ns'])} vs {b['n_kernels']} "
            f"kernels {_ms(b['kernel_ns'])} (allowed ±{_ms(allowed)})"
        )
    if not lines:
        return Check("graph/node", "graph time vs node kernel time", FAIL, "no generate ranges")
    return Check("graph/node", "graph time vs node kernel time", FAIL if bad else PASS,
                 "; ".join(lines))  # fmt: skip


def check_energy(run: ModeRun, cfg: Config) -> Check:
    """Driver phases' energy (analysis, sampler's counter) vs the driver's own counter reads."""
    name = "energy per phase: analysis vs counter reads"
    if run.power is None or not run.reads:
        return Check(run.mode, name, FAIL, "no power samples or counter reads came back")
    uuids = [normalize_gpu_uuid(h.get("uuid")) for h in run.events["hellos"].values()]
    samples, device = select_device(load_samples([run.power]), uuids[0])
    period = counter_period(
        {"energy_counter_updates": update_period_ms(samples["t_ns"].to_list(),
                                                    samples["energy_mj"].to_list())}
    )[0]  # fmt: skip
    drv = run.events["driver_pid"]
    table = run.phases.filter((pl.col("pid") == drv) & (pl.col("attribution") == "window"))
    own = run.recorder.filter(pl.col("pid") == drv)
    by_phase, rows = reads_by_phase(run.reads), []
    for r in table.filter(pl.col("step") >= 1).iter_rows(named=True):
        pair, phase_name = by_phase.get((r["step"], r["phase"]), {}), r["phase"]
        mono = own.filter((pl.col("step") == r["step"]) & (pl.col("name") == phase_name))
        if {"start", "end"} - set(pair) or mono.height != 1 or r["energy_j"] is None:
            continue
        t0 = int(mono["start_mono_ns"][0])
        res = end_resolution_j(samples, device, [t0, t0 + int(mono["dur_ns"][0])], period)
        ref = (pair["end"]["energy_mj"] - pair["start"]["energy_mj"]) / 1000.0
        tol = max(cfg.tol_phase_energy * abs(ref), sum(res))
        rows.append((r["step"], phase_name, r["energy_j"], ref, tol))
    if not rows:
        return Check(run.mode, name, FAIL, "no driver phase has energy and both reads")
    bad = [x for x in rows if abs(x[2] - x[3]) > x[4]]
    worst = max(rows, key=lambda x: abs(x[2] - x[3]) / x[4])
    detail = (
        f"{len(rows) - len(bad)}/{len(rows)} phases within tol = max({cfg.tol_phase_energy:.0%}, "
        f"one counter update ({period / 1e6:.0f} ms) at each end); worst step {worst[0]} "
        f"{worst[1]}: {worst[2]:.2f} J vs {worst[3]:.2f} J (tol {worst[4]:.2f} J)"
    )
    return Check(run.mode, name, FAIL if bad else PASS, detail)
