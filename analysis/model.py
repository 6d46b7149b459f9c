"""What an analysis produces: :class:`Analysis` (frames) and :class:`RunSummary` (the run's totals).

Both are immutable once built. An :class:`Analysis` of a run too big for memory keeps its
per-operation rows in Parquet parts in a temporary folder it owns; ``close()`` (or leaving a
``with`` block) removes them, not the garbage collector.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import polars as pl

from .errors import SavedAnalysisError

#: The two attribution schemes (column ``attribution`` of the phase table). *projection*: an
#: operation belongs to the ranges enclosing its launching CUDA call on the same thread (NVIDIA's
#: definition); *window*: a driver range owns every GPU's work while it is open.
PROJECTION: Final = "projection"
WINDOW: Final = "window"
ATTRIBUTIONS: Final = (PROJECTION, WINDOW)

#: The columns naming one CPU thread across files (the file's label and nsys's global thread
#: id): where a range was marked and where an operation was launched.
THREAD: Final = ("trace", "gtid")

#: The column (per range, and per phase-table row: any of its ranges) flagging a range that ends
#: exactly at the end of its file's capture: nsys closed it there, so its duration is not its own
#: (:func:`analysis.attribute.phase_ranges.mark_cut`).
CUT: Final = "cut_at_capture_end"


@dataclass(frozen=True)
class TraceInfo:
    """One export file of the run: where it came from and how it was put on the run's clock."""

    label: str
    path: str
    nsys_version: str | None
    host: str | None
    session_start_utc_ns: int | None
    clock_zero_utc_ns: int | None
    clock_offset_ns: int
    missing_tables: list[str]
    #: the capture's end on the run's clock (``ANALYSIS_DETAILS.duration`` + offset); None: unknown.
    #: nsys ends a range still open when the capture stops here (see fidelity)
    capture_end_ns: int | None = None


@dataclass(frozen=True)
class GpuDevice:
    """A physical GPU of the run and how it was identified across files."""

    device: str
    identity: str  # "uuid", "bus", or "file" (only this file's deviceId was known)
    gpu_name: str | None
    uuid: str | None
    bus_location: str | None
    host: str | None
    traces: list[str]


@dataclass(frozen=True)
class GpuTotals:
    """GPU time and counts over the whole run; attributed and unattributed measured separately.

    ``total_gpu_ns`` and the counts come from the operations as read; ``attributed_gpu_ns``
    (window, innermost phase wins) and ``projection_attributed_gpu_ns`` (top-level projection
    ranges) from the sums the phase rows are built from; the unattributed parts from the
    operations as read (outside every window-timeline range; launched inside no projection
    range of their thread, or without a launching call). ``gpu_time_conserved``: both schemes'
    two parts add up to the total (see :mod:`analysis.attribute.conservation`); a ``--steps``
    selection keeps the whole run's verdict.
    """

    total_gpu_ns: int
    attributed_gpu_ns: int
    unattributed_gpu_ns: int
    projection_attributed_gpu_ns: int
    projection_unattributed_gpu_ns: int
    gpu_time_conserved: bool
    n_gpu_ops: int
    n_kernels: int
    kernel_ns: int
    nccl_ns: int
    memcpy_ns: int
    memcpy_bytes: int
    memset_ns: int
    graph_ns: int
    n_graphs: int


@dataclass(frozen=True)
class EnergyTotals:
    """Energy over the whole run (only with power samples), checked independently."""

    total_energy_j: float
    attributed_energy_j: float
    unattributed_energy_j: float
    energy_conserved: bool
    energy_balance_j: float
    power_source: str
    power_interval_ns: int | None
    power_alignment: list[dict[str, Any]]
    idle_power_w: dict[str, float | None]


@dataclass(frozen=True)
class InputFile:
    """A file the analysis read, as it was then: absolute path, size and modification time."""

    kind: str  # "trace", "power", "phase_map", or a token source: "lengths", "verl_log"
    path: str
    size_bytes: int | None  # None: it could not be read (gone, or not a file)
    mtime_utc: str | None  # ISO 8601, UTC


@dataclass(frozen=True)
class Provenance:
    """What produced a summary: versions, command line, options, inputs and when.

    ``command_line`` is the CLI's arguments with the program named ``nvtx-phases`` (None from
    the Python API). ``options`` holds :func:`analysis.run.pipeline.analyze`'s options
    (``phase_map``: None for the default map, ``"custom"`` for a map object given to the API,
    else the TOML file's absolute path; ``all_ranges``, ``power_files`` (None: found beside the
    traces), ``idle_power_w``, ``jobs``, ``engine``, ``chunk_ops``, ``spill_dir``,
    ``force_combine``) and the command's own (``top_kernels``).
    """

    tool_version: str
    python_version: str
    polars_version: str
    command_line: list[str] | None
    options: dict[str, Any]
    inputs: list[InputFile]
    analyzed_at_utc: str  # ISO 8601, UTC

    def to_dict(self) -> dict[str, Any]:
        """The ``provenance`` object of ``summary.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        """Read back :meth:`to_dict`'s mapping (KeyError/TypeError when it is not one)."""
        fields = _fields(cls, data)
        return cls(
            **(fields | {"inputs": [InputFile(**_fields(InputFile, f)) for f in fields["inputs"]]})
        )


def tool_version() -> str:
    """nvtx-phases's version: the installed package's, else ``pyproject.toml``'s beside it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvtx-phases")
    except PackageNotFoundError:
        pass
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        project = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return str(tomllib.loads(project.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


@dataclass(frozen=True)
class RunSummary:
    """The run's totals and provenance, as written to ``summary.json``.

    ``energy`` is None without power samples; ``summary.json`` then carries ``power_source:
    null`` and none of the energy keys (the file's layout is unchanged from earlier versions).
    """

    gpu: GpuTotals
    window_timeline: str  # "driver": window phases come from driver ranges; "all": no driver
    n_phase_ranges: int
    n_devices: int
    n_steps: int
    energy: EnergyTotals | None
    gpus: list[str]
    driver_versions: list[str]
    traces: list[TraceInfo]
    missing_tables: list[str]
    devices: list[GpuDevice]
    n_ranges: int
    n_buckets: int
    power_files: list[str]
    warnings: list[str]
    #: None for a summary.json written before provenance was recorded
    provenance: Provenance | None = None
    #: what ``--steps`` kept and excluded (None: the whole run); see analysis.run.select
    selection: dict[str, Any] | None = None
    #: the run's GPU pools, each with its GPU time balance (``pools.csv``'s rows); None: no pools
    pools: list[dict[str, Any]] | None = None
    #: what the analysis noticed about its inputs that changes no number (:attr:`Analysis.notes`:
    #: no GPU metrics, no memory events captured, ...); empty in a summary written before
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` object: one flat mapping, keys in a fixed order."""
        out: dict[str, Any] = dataclasses.asdict(self.gpu)
        out |= {
            "window_timeline": self.window_timeline,
            "n_phase_ranges": self.n_phase_ranges,
            "n_devices": self.n_devices,
            "n_steps": self.n_steps,
        }
        out |= dataclasses.asdict(self.energy) if self.energy else {"power_source": None}
        out |= {
            "gpus": self.gpus,
            "driver_versions": self.driver_versions,
            "traces": [dataclasses.asdict(t) for t in self.traces],
            "missing_tables": self.missing_tables,
            "devices": [dataclasses.asdict(d) for d in self.devices],
            "n_ranges": self.n_ranges,
            "n_buckets": self.n_buckets,
            "power_files": self.power_files,
            "warnings": self.warnings,
            "notes": self.notes,
            "provenance": self.provenance.to_dict() if self.provenance else None,
        }
        if self.selection is not None:
            out["selection"] = self.selection
        if self.pools is not None:
            out["pools"] = self.pools
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "summary.json") -> RunSummary:
        """Read back :meth:`to_dict`'s mapping; a key it needs and lacks names the file."""
        try:
            energy = None
            if data.get("power_source") is not None:
                energy = EnergyTotals(**_fields(EnergyTotals, data))
            provenance = data.get("provenance")  # absent from older summaries
            return cls(
                gpu=GpuTotals(**_fields(GpuTotals, data)),
                energy=energy,
                traces=[TraceInfo(**_fields(TraceInfo, t)) for t in data["traces"]],
                devices=[GpuDevice(**_fields(GpuDevice, d)) for d in data["devices"]],
                provenance=Provenance.from_dict(provenance) if provenance is not None else None,
                selection=data.get("selection"),
                pools=data.get("pools"),
                notes=list(data.get("notes", [])),  # absent from older summaries
                **{
                    f.name: data[f.name]
                    for f in dataclasses.fields(cls)
                    if f.name
                    not in (
                        "gpu",
                        "energy",
                        "traces",
                        "devices",
                        "provenance",
                        "selection",
                        "pools",
                        "notes",
                    )
                },
            )
        except (KeyError, TypeError) as exc:
            raise SavedAnalysisError(
                f"{source}: not a summary this version can read (missing {exc}); "
                "run `nvtx-phases analyze` again"
            ) from None


def _fields(kind: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that are fields of dataclass ``kind``.

    KeyError if one without a default lacks (a field added later, with a default, may).
    """
    return {
        f.name: data[f.name]
        for f in dataclasses.fields(kind)
        if f.name in data or f.default is dataclasses.MISSING
    }


@dataclass(frozen=True)
class Analysis:
    """Everything ``analyze`` computes; frames are ready to write. Immutable.

    Use it as a context manager (``with analyze(paths) as result:``) or call :meth:`close`
    when done: a run attributed in several time buckets keeps ``gpu_activity`` as Parquet parts
    in a temporary folder this object owns.
    """

    #: One row per phase range: ``step, path, phase, attribution, wall_ns, gpu_busy_ns, …``.
    phases: pl.DataFrame
    #: Window phases per GPU: where each rank's GPU was busy or idle during a driver phase.
    phase_devices: pl.DataFrame
    #: One row per GPU operation with its step and phase under each scheme (lazy: may be big).
    gpu_activity: pl.LazyFrame
    #: Kernels by name: count, total, mean, class.
    kernels: pl.DataFrame
    #: One row per step: ``step, step_start_ns, step_end_ns`` (per process where steps are).
    steps: pl.DataFrame
    summary: RunSummary
    #: Power samples on the run's clock (``device, t_ns, power_w, energy_mj``), if any.
    power_samples: pl.DataFrame | None = None
    #: One row per phase range (``rid, trace, pid, tid, gtid, name, domain, canonical, path,
    #: level, step, attribution, start_ns, end_ns, cut_at_capture_end``); None when read back
    #: from a folder of a version that did not write ``ranges.parquet``.
    ranges: pl.DataFrame | None = None
    #: nsys GPU metrics per (phase row, GPU, metric): ``n_samples, mean, p95, min, max``; None
    #: when no export holds GPU metrics (:mod:`analysis.aggregate.gpu_metrics`).
    gpu_metrics: pl.DataFrame | None = None
    #: Device memory in use per (phase row, GPU): ``entry_bytes, peak_bytes, mean_bytes``; None
    #: when no file holds memory events (:mod:`analysis.aggregate.memory`).
    memory: pl.DataFrame | None = None
    #: One row per GPU pool (``pool, source, n_devices, devices, processes, total_gpu_ns,
    #: attributed_gpu_ns, unattributed_gpu_ns, gpu_time_conserved``); None for a run without
    #: pools (one pool of every GPU: :mod:`analysis.attribute.pools`).
    pools: pl.DataFrame | None = None
    #: Idle GPU time per pool, step (or parameter version) and cause (``pool, step, cause,
    #: n_devices, wall_ns, gpu_busy_ns, idle_ns``; :mod:`analysis.attribute.idle_causes`); None
    #: for a run without pools.
    idle_causes: pl.DataFrame | None = None
    #: Staleness of each trainer step's samples (``step, version, n_samples, min_lag, mean_lag,
    #: max_lag, stale_share, sample_versions``; :mod:`analysis.aggregate.staleness`); None
    #: without samples marks.
    staleness: pl.DataFrame | None = None
    #: Tokens per step (``step, prompt_tokens, response_tokens, total_tokens, n_sequences,
    #: source, note``; :mod:`analysis.workload.tokens`) from length records or VeRL logs; None
    #: when none were given.
    step_tokens: pl.DataFrame | None = None
    #: What the analysis noticed about its inputs that changes no number (e.g. no GPU metrics
    #: captured); the commands print them as notes, ``summary.json`` saves them (``notes``).
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: Temporary folder owned by this result (removed by :meth:`close`), if any.
    workdir: Path | None = field(default=None, repr=False, compare=False)

    @property
    def warnings(self) -> list[str]:
        """What the user should know about this result (also in ``summary.json``)."""
        return self.summary.warnings

    def close(self) -> None:
        """Remove the temporary files behind ``gpu_activity`` (idempotent)."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Analysis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
