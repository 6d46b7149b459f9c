"""Read nsys GPU metric samples (``GPU_METRICS``, ``TARGET_INFO_GPU_METRICS``) from exports.

Layout (DDL of nsys 2023.4.4, export schema 3.7.2, in
``analysis/synth/schema/nsys-gpu-metrics-2023.4.4.sql``): ``GPU_METRICS(timestamp, typeId,
metricId, value)`` holds one row per metric per sample (``timestamp`` on the session's
timeline, like every other event; newer exports are reported to add ``rawTimestamp``, not read);
``TARGET_INFO_GPU_METRICS(typeId, sourceId, typeName, metricId, metricName)`` names each
``(typeId, metricId)``. ``metricId`` is "not assumed to be stable" (the DDL's own words), so
metrics are matched by name, per ``typeId``. Names carry their unit, ``SM Active [Throughput %]``;
the metric is the name without it (:func:`split_metric_name`), and Blackwell's ``SMs Active`` is
read as ``SM Active``. Values are as recorded: an H200 export of nsys 2023.4.4 holds its clocks
(``GPC Clock Frequency [MHz]``) in Hz.

Which GPU: ``typeId & 0xFF`` is the GPU's ``TARGET_INFO_GPU.id``, as NVIDIA's own recipes read it
(``gpu_metric_util_map``: ``typeId & 0xFF``; ``nvlink_sum``: that joined to
``TARGET_INFO_GPU.id``). The GPU is then named like the operations
(:func:`analysis.normalize.devices.gpu_identities`: ``GPU-<uuid>``, else host/bus location,
else ``<file>:<id>``), so samples and operations meet on one physical GPU.

Files are opened read-only through :class:`~analysis.read.export.Export` with the declared
specs :data:`analysis.read.specs.GPU_METRICS` and :data:`~analysis.read.specs.GPU_METRICS_INFO`.
``GPU_METRICS`` is streamed in batches (at the default 10 kHz an H200 gives 22 metrics: 220,000
rows a second per GPU), and only the wanted metrics' rows are kept.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ..errors import MissingColumns, TraceReadError
from ..frames import PolarsDataType
from ..model import TraceInfo
from ..read import specs as T
from ..read.export import Export, RawTrace
from .devices import fallback_device, gpu_identities

#: ``typeId & GPU_INDEX_MASK`` is the sampled GPU's ``TARGET_INFO_GPU.id``.
GPU_INDEX_MASK = 0xFF
#: Metrics read unless the caller asks for others: NVIDIA's per-range summary's (SM Active,
#: Tensor Active, DRAM bandwidth) and the engine-level ones beside them.
DEFAULT_METRICS = (
    "GR Active",
    "SM Active",
    "SM Issue",
    "Tensor Active",
    "DRAM Read Bandwidth",
    "DRAM Write Bandwidth",
)
#: Other names nsys versions give a metric → the name used here.
ALIASES = {"SMs Active": "SM Active"}
BATCH_ROWS = 1_000_000
#: One GPU metric sample on the run's clock (what :mod:`analysis.normalize.gpu_metrics` yields).
SAMPLES_SCHEMA: dict[str, PolarsDataType] = {
    "ts_ns": pl.Int64,
    "device": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
}
#: The metrics each GPU was sampled for (a GPU with no sample in a phase still gets its rows).
AVAILABLE_SCHEMA: dict[str, PolarsDataType] = {
    "device": pl.String,
    "metric": pl.String,
    "unit": pl.String,
}
_NO_METRICS_HINT = "capture with `nsys profile --gpu-metrics-devices=all`"
_NO_TABLE = "no GPU_METRICS table"
_IDS_SCHEMA = {
    "typeId": pl.Int64,
    "metricId": pl.Int64,
    "device": pl.String,
    "metric": pl.String,
    "unit": pl.String,
}


def split_metric_name(name: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(metric, unit) of nsys's ``Name [Unit]`` metric names; aliases (:data:`ALIASES`) applied."""
    bare = name.str.replace(r"\s*\[[^\]]*\]\s*$", "").str.strip_chars()
    unit = name.str.extract(r"\[([^\]]*)\]\s*$", 1)
    return bare.replace(ALIASES), unit


@dataclass(frozen=True)
class MetricSource:
    """One export's GPU metrics: where they are and what each ``(typeId, metricId)`` is."""

    path: Path
    label: str
    #: added to ``timestamp``: the file's offset onto the run's clock
    offset_ns: int
    #: typeId, metricId → device, metric, unit (wanted metrics only)
    ids: pl.DataFrame


@dataclass
class RunGpuMetrics:
    """A run's GPU metric sources, the metrics of each sampled GPU, and notes for the user."""

    sources: list[MetricSource]
    #: :data:`AVAILABLE_SCHEMA`
    available: pl.DataFrame
    notes: list[str] = field(default_factory=list)

    def samples(self, rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
        """Every wanted sample, file by file in batches of about ``rows`` rows (SAMPLES_SCHEMA)."""
        for source in self.sources:
            yield from source_samples(source, rows)


def source_samples(source: MetricSource, rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
    """``source``'s wanted samples on the run's clock: ts_ns, device, metric, value."""
    export = Export(source.path)
    try:
        for batch in export.batches(T.GPU_METRICS, rows):
            yield (
                batch.lazy()
                .filter(pl.col("timestamp").is_not_null())
                .join(source.ids.lazy(), on=["typeId", "metricId"])
                .select(
                    (pl.col("timestamp").cast(pl.Int64) + source.offset_ns).alias("ts_ns"),
                    "device",
                    "metric",
                    pl.col("value").cast(pl.Float64),
                )
                .collect()
            )
    finally:
        export.close()


def metric_source(
    path: str | Path,
    *,
    label: str | None = None,
    host: str = "",
    offset_ns: int = 0,
    metrics: Collection[str] | None = DEFAULT_METRICS,
) -> tuple[MetricSource | None, list[str]]:
    """One export's :class:`MetricSource` (None when it holds no GPU metrics) and notes.

    ``metrics``: the metric names wanted (None: all); ``host`` names GPUs known only by bus
    location, as :func:`analysis.normalize.devices.gpu_identities` does.
    """
    path = Path(path)
    label = label or path.stem
    try:
        export = Export(path)
    except TraceReadError as exc:
        return None, [f"{exc}: its GPU metrics are left out"]
    try:
        if export.resolve_table(T.GPU_METRICS) is None:
            return None, [f"{label}: {_NO_TABLE} ({_NO_METRICS_HINT})"]
        info = export.read(T.GPU_METRICS_INFO)
        if info is None or info.is_empty():
            return None, [f"{label}: GPU_METRICS without TARGET_INFO_GPU_METRICS: metrics unnamed"]
        gpus = export.read(T.TARGET_GPU)
    except (MissingColumns, TraceReadError) as exc:
        return None, [f"{exc}: its GPU metrics are left out"]
    finally:
        export.close()
    raw = RawTrace(
        path=path,
        label=label,
        frames={} if gpus is None else {T.TARGET_GPU.name: gpus},
        missing_tables=[],
        meta={},
        session_start_utc_ns=None,
        clock_zero_utc_ns=None,
        duration_ns=None,
        host=host,
    )
    ids, notes = _named_ids(info, gpu_identities(raw), label, metrics)
    if ids.is_empty():
        return None, [*notes, f"{label}: its GPU metrics hold none of {', '.join(metrics or ())}"]
    return MetricSource(path, label, offset_ns, ids), notes


def _named_ids(
    info: pl.DataFrame,
    identities: pl.DataFrame,
    label: str,
    metrics: Collection[str] | None,
) -> tuple[pl.DataFrame, list[str]]:
    """typeId, metricId → device, metric, unit; notes on GPUs the export does not describe."""
    metric, unit = split_metric_name(pl.col("metricName"))
    ids = info.select(
        pl.col("typeId").cast(pl.Int64),
        pl.col("metricId").cast(pl.Int64),
        (pl.col("typeId").cast(pl.Int64) & GPU_INDEX_MASK).alias("device_id"),
        metric.alias("metric"),
        unit.alias("unit"),
    ).unique(subset=["typeId", "metricId"], keep="first", maintain_order=True)
    if metrics is not None:
        wanted = {m.lower() for m in metrics}
        ids = ids.filter(pl.col("metric").str.to_lowercase().is_in(list(wanted)))
    named = ids.join(identities.select("device_id", "device"), on="device_id", how="left")
    unknown = sorted(set(named.filter(pl.col("device").is_null())["device_id"].to_list()))
    named = named.with_columns(
        pl.coalesce("device", fallback_device(label, pl.col("device_id"))).alias("device")
    )
    notes = []
    if unknown:
        notes.append(
            f"{label}: GPU metrics of GPU id(s) {', '.join(map(str, unknown))} not in "
            "TARGET_INFO_GPU: named by file and id, so they meet operations only of this file"
        )
    return named.select(list(_IDS_SCHEMA)).cast(_IDS_SCHEMA), notes  # type: ignore[arg-type]


def read_run_gpu_metrics(
    traces: Sequence[TraceInfo], *, metrics: Collection[str] | None = DEFAULT_METRICS
) -> RunGpuMetrics:
    """The GPU metric sources of a run's files (``Analysis.summary.traces``), on its clock.

    A GPU sampled in several files (several nsys sessions on one node) keeps the first file's
    samples, with a note. Never raises for a file without metrics: it is a note.
    """
    sources: list[MetricSource] = []
    notes: list[str] = []
    claimed: dict[str, str] = {}
    for trace in traces:
        source, found = metric_source(
            trace.path,
            label=trace.label,
            host=trace.host or "",
            offset_ns=trace.clock_offset_ns,
            metrics=metrics,
        )
        notes += found
        if source is None:
            continue
        devices = sorted(set(source.ids["device"].to_list()))
        taken = [d for d in devices if d in claimed]
        if taken:
            notes.append(
                f"{trace.label}: GPU(s) {', '.join(taken)} also sampled in "
                f"{', '.join(sorted({claimed[d] for d in taken}))}; that file's samples are used"
            )
            ids = source.ids.filter(~pl.col("device").is_in(taken))
            if ids.is_empty():
                continue
            source = MetricSource(source.path, source.label, source.offset_ns, ids)
        claimed.update({d: trace.label for d in devices if d not in claimed})
        sources.append(source)
    if not sources and all(_NO_TABLE in n for n in notes):  # one note instead of one per file
        notes = [f"no GPU metrics in the run's exports ({_NO_METRICS_HINT}): no GPU metric table"]
    elif not sources:
        notes.append("no usable GPU metrics in the run's exports: no GPU metric table")
    return RunGpuMetrics(sources, _available(sources), notes)


def _available(sources: list[MetricSource]) -> pl.DataFrame:
    if not sources:
        return pl.DataFrame(schema=AVAILABLE_SCHEMA)
    return (
        pl.concat([s.ids.select(list(AVAILABLE_SCHEMA)) for s in sources])
        .unique(subset=["device", "metric"], keep="first", maintain_order=True)
        .sort("device", "metric")
    )


def read_gpu_metrics(
    path: str | Path,
    *,
    label: str | None = None,
    metrics: Collection[str] | None = DEFAULT_METRICS,
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """One export's samples on its own clock, whole: (samples, available, notes).

    For small exports and notebooks; a run's files go through :func:`read_run_gpu_metrics`.
    """
    source, notes = metric_source(path, label=label, metrics=metrics)
    if source is None:
        return pl.DataFrame(schema=SAMPLES_SCHEMA), pl.DataFrame(schema=AVAILABLE_SCHEMA), notes
    parts = list(source_samples(source))
    samples = pl.concat(parts) if parts else pl.DataFrame(schema=SAMPLES_SCHEMA)
    return samples, _available([source]), notes
