"""Power logs from DCGM, nvidia-smi and Zeus as power samples (:mod:`.samples`' columns).

A log is given where the NVML sampler's Parquet is (``--power FILE``); options follow the file
name after commas: ``--power 'smi.csv,tz=UTC'``. Options: ``tz`` (zone of timestamps written
without one: nvidia-smi's local time; ``UTC``, ``+02:00``, ``Europe/Berlin``), ``host`` (the
traced host the log's GPU indices belong to), ``gpus`` (Zeus: the monitored GPU indices,
``gpus=0+2``), ``columns`` (nvidia-smi ``noheader``: the ``--query-gpu`` list,
``columns=timestamp+index+uuid+power.draw``), ``format`` (``nvidia-smi``, ``dcgm``, ``zeus``:
instead of recognizing it).

Readings are put on the trace's clock through their UTC wall-clock time and the traces' session
start (:func:`analysis.energy.samples.align`); a log without absolute times is refused. What
each log lacks (an energy counter, GPU UUIDs) is said in one line per file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import InputError
from .power_log_formats import (
    parse_dcgm_dmon,
    parse_nvidia_smi,
    parse_zeus_csv,
)

#: ``format`` of the samples from the NVML sampler's Parquet (:func:`.samples.load_samples`)
SAMPLER_FORMAT = "nvml"
FORMATS = {"nvidia-smi": "nvidia-smi CSV", "dcgm": "dcgmi dmon", "zeus": "Zeus PowerMonitor CSV"}
_OPTIONS = ("tz", "host", "gpus", "columns", "format")
#: a gap this many median intervals long is reported (a logger that stalled or restarted)
GAP_FACTOR = 5


@dataclass(frozen=True)
class LogSpec:
    """A power file as given: its path and the options after its name."""

    path: Path
    tz: str | None = None
    host: str | None = None
    gpus: list[int] | None = None
    columns: list[str] | None = None
    format: str | None = None


def parse_spec(given: str | Path) -> LogSpec:
    """``FILE[,key=value…]`` → :class:`LogSpec` (a file that exists by the whole name is a file)."""
    text = str(given)
    if Path(text).exists():
        return LogSpec(Path(text))
    pattern = r",(?=(?:" + "|".join(_OPTIONS) + r")=)"
    path, *options = re.split(pattern, text)
    _check_option_names(text, path)
    values: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        values[key] = value.strip()
    fmt = values.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"{text}: format={fmt}: one of {', '.join(FORMATS)}")
    try:
        gpus = [int(g) for g in values["gpus"].split("+")] if "gpus" in values else None
    except ValueError:
        raise InputError(f"{text}: gpus= takes GPU indices joined by '+': gpus=0+1") from None
    return LogSpec(
        Path(path),
        tz=values.get("tz") or None,
        host=values.get("host") or None,
        gpus=gpus,
        columns=values["columns"].split("+") if "columns" in values else None,
        format=fmt,
    )


def _check_option_names(text: str, path: str) -> None:
    """A misspelt option (``smi.csv,tzz=UTC``) is named, not read as part of the file name."""
    head, *parts = text.split(",")
    if Path(path).exists() or not parts or not Path(head).exists():
        return
    for part in parts:
        key = part.partition("=")[0].strip()
        if key not in _OPTIONS:
            raise InputError(
                f"{text}: unknown power-log option {key} (expected {', '.join(_OPTIONS)})"
            )


def is_power_log(given: str | Path) -> bool:
    """Whether ``given`` names a log to parse here rather than the sampler's Parquet."""
    spec = parse_spec(given)
    if spec.format or spec.tz or spec.columns or spec.gpus or spec.host:
        return True
    try:
        with spec.path.open("rb") as handle:
            return handle.read(4) != b"PAR1"
    except OSError:
        return False


def detect_format(lines: list[str]) -> str | None:
    """The tool that wrote these first lines, or None."""
    text = [line for line in lines if line.strip()]
    if not text:
        return None
    if any("#Entity" in line for line in text[:5]):
        return "dcgm"
    if re.match(r"^\s*timestamp\s*,", text[0]) or "power.draw" in text[0]:
        return "nvidia-smi"
    if re.match(r"^(time|\d{9,11}(\.\d+)?),[^,]", text[0]):
        return "zeus"
    if text[0].startswith("start_time,window_name,elapsed_time"):
        return "zeus-window"
    if re.match(r"^\s*\d{4}[/-]\d{2}[/-]\d{2}[ T]\d", text[0]) and "," in text[0]:
        return "nvidia-smi-noheader"
    return None


def _lines(spec: LogSpec) -> pl.Series:
    try:
        text = spec.path.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"{spec.path}: cannot read power log ({exc.strerror or exc})") from None
    lines = pl.Series("line", text.splitlines(), dtype=pl.String)
    return lines.filter(lines.str.strip_chars() != "")


def read_power_log(given: str | Path) -> tuple[pl.DataFrame, str, str]:
    """One log → (:data:`LOG_SCHEMA` rows, format name, one line on what was read and lacks)."""
    spec = parse_spec(given)
    where = str(spec.path)
    lines = _lines(spec)
    fmt = spec.format or detect_format(lines.head(5).to_list())
    if fmt == "zeus-window":
        raise InputError(
            f"{where}: a Zeus ZeusMonitor log (energy per measurement window), not power over "
            "time; log power with Zeus's PowerMonitor, nvidia-smi or dcgmi dmon"
        )
    if fmt == "nvidia-smi-noheader" and spec.columns is None:
        raise InputError(
            f"{where}: nvidia-smi CSV without a header (noheader): name its columns, "
            "'FILE,columns=timestamp+index+uuid+power.draw' (the --query-gpu list)"
        )
    if fmt is None:
        raise InputError(
            f"{where}: not a power log this tool reads (the NVML sampler's Parquet, nvidia-smi "
            "--query-gpu CSV, dcgmi dmon with stamped lines, Zeus PowerMonitor CSV)"
        )
    fmt = "nvidia-smi" if fmt.startswith("nvidia-smi") else fmt
    try:
        frame, read = _parse(spec, fmt, lines, where)
        frame = frame.filter(pl.col("wall_ns").is_not_null())
        return frame, fmt, _describe(spec, fmt, frame, read)
    except (InputError, pl.exceptions.PolarsError, ValueError, IndexError) as exc:
        raise _parse_error(exc, spec, fmt, lines) from None


def _parse_error(exc: Exception, spec: LogSpec, fmt: str, lines: pl.Series) -> Exception:
    """One line for a log its parser cannot read: a forced format on another tool's file says so."""
    found = detect_format(lines.head(5).to_list()) or ""
    found = "nvidia-smi" if found.startswith("nvidia-smi") else found
    if isinstance(exc, InputError) and (spec.format is None or found == fmt):
        return exc
    why = (str(exc).splitlines() or [type(exc).__name__])[0].removeprefix(f"{spec.path}: ")
    if found and found != fmt:
        return InputError(
            f"{spec.path}: not a {FORMATS[fmt]} (it reads as {FORMATS.get(found, found)}: "
            "leave out format=)"
        )
    return InputError(f"{spec.path}: cannot be read as a {FORMATS[fmt]} ({why})")


def _parse(spec: LogSpec, fmt: str, lines: pl.Series, where: str) -> tuple[pl.DataFrame, str]:
    if fmt == "nvidia-smi":
        return parse_nvidia_smi(lines, spec.tz, spec.columns, where)
    if fmt == "dcgm":
        return parse_dcgm_dmon(lines, spec.tz, where)
    return parse_zeus_csv(lines, spec.gpus, where)


def _describe(spec: LogSpec, fmt: str, frame: pl.DataFrame, read: str) -> str:
    """What was read, what the log lacks, and its holes: one line."""
    usable = frame.filter(pl.col("power_w").is_not_null())
    if usable.is_empty():
        raise InputError(f"{spec.path}: {FORMATS[fmt]} with no power reading")
    has_uuid = usable["uuid"].null_count() == 0
    has_counter = usable["energy_mj"].null_count() == 0
    n_gpus = usable.select(pl.coalesce("uuid", pl.col("device").cast(pl.String)).n_unique()).item()
    parts = [
        f"power log {spec.path.name}: {FORMATS[fmt]} ({read}); {usable.height:,} readings of "
        f"{n_gpus} GPU(s)",
        "GPUs matched by UUID"
        if has_uuid
        else "no GPU UUIDs: matched by index"
        + (f" on host {spec.host}" if spec.host else "")
        + " (the index must be the trace's device id: CUDA_DEVICE_ORDER=PCI_BUS_ID)",
        "energy from its total-energy counter" if has_counter else "no energy counter",
    ]
    missing = frame.height - usable.height
    if missing:
        parts.append(f"{missing:,} row(s) without a reading ([N/A]) left out, not read as 0 W")
    parts += _gaps(usable)
    return "; ".join(parts)


def _gaps(frame: pl.DataFrame) -> list[str]:
    """Stretches with no reading longer than :data:`GAP_FACTOR` median intervals, per GPU."""
    dt = pl.col("wall_ns").diff().over("gpu")
    steps = (
        frame.with_columns(pl.coalesce("uuid", pl.col("device").cast(pl.String)).alias("gpu"))
        .sort("gpu", "wall_ns")
        .with_columns(dt.alias("dt"))
        .with_columns(pl.col("dt").median().over("gpu").alias("typical"))
    )
    gaps = steps.filter((pl.col("typical") > 0) & (pl.col("dt") > GAP_FACTOR * pl.col("typical")))
    if gaps.is_empty():
        return []
    longest = gaps["dt"].max()
    return [
        f"{gaps.height} gap(s) longer than {GAP_FACTOR}× the sampling interval (longest "
        f"{int(longest) / 1e9:.3f} s): energy across a gap is interpolated between its ends"  # type: ignore[arg-type]
    ]


def log_samples(given: str | Path) -> tuple[pl.DataFrame, str]:
    """A log as :func:`analysis.energy.samples.load_samples` rows, and its one-line description."""
    spec = parse_spec(given)
    frame, fmt, note = read_power_log(given)
    rows = frame.filter(pl.col("power_w").is_not_null())
    return (
        rows.select(
            pl.lit(spec.host, dtype=pl.String).alias("host"),
            pl.lit(None, dtype=pl.Int64).alias("pid"),
            pl.col("device").cast(pl.Int64),
            pl.col("uuid").cast(pl.String),
            pl.col("wall_ns").cast(pl.Int64),
            pl.lit(None, dtype=pl.Int64).alias("mono_ns"),
            pl.col("power_w").cast(pl.Float64),
            pl.col("energy_mj").cast(pl.Int64),
            pl.lit(str(given)).alias("source"),
            pl.lit(fmt).alias("format"),
            pl.lit(note).alias("note"),
        ),
        note,
    )


def log_hosts(samples: pl.DataFrame, aliases: dict[str, str]) -> pl.DataFrame:
    """Logs' GPU indices without a host: the run's one host, else refused (say ``host=``)."""
    orphans = samples.filter(
        (pl.col("format") != SAMPLER_FORMAT) & pl.col("uuid").is_null() & pl.col("host").is_null()
    )
    if orphans.is_empty():
        return samples
    hosts = sorted({alias.rsplit(":", 1)[0] for alias in aliases})
    if len(hosts) > 1:
        files = ", ".join(sorted(set(orphans["source"])))
        raise InputError(
            f"{files}: GPUs named by index only and the run has hosts {', '.join(hosts)}: "
            "say which, 'FILE,host=NAME'"
        )
    return samples.with_columns(
        pl.when(pl.col("format") != SAMPLER_FORMAT)
        .then(pl.col("host").fill_null(hosts[0] if hosts else "?"))
        .otherwise(pl.col("host"))
        .alias("host")
    )


def log_alignment(
    samples: pl.DataFrame, origin_utc_ns: int | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per log file: its alignment entry, and its one line (what it is, lacks, how it was placed)."""
    logs = (
        samples.filter(pl.col("format") != SAMPLER_FORMAT)
        .group_by("source", "format", "note")
        .agg(pl.col("host").first(), pl.len().alias("n"))
        .sort("source")
    )
    if logs.is_empty():
        return [], []
    if origin_utc_ns is None:
        raise InputError(
            f"{', '.join(logs['source'])}: the traces carry no session start "
            "(TARGET_INFO_SESSION_START_TIME), so a power log cannot be put on their clock"
        )
    alignment = [
        {
            "host": row["host"],
            "pid": None,
            "offset_ns": -origin_utc_ns,
            "spread_ns": None,
            "n_marks": 0,
            "method": "log wall clock",
            "source": row["source"],
            "format": row["format"],
        }
        for row in logs.iter_rows(named=True)
    ]
    warnings = [
        f"{note}; on the trace clock by its UTC time minus the traces' session start "
        "(accuracy = clock sync between the logging and the traced hosts)"
        for note in logs["note"]
    ]
    return alignment, warnings


def clip_to_capture(aligned: pl.DataFrame, span: tuple[int, int]) -> tuple[pl.DataFrame, list[str]]:
    """Log readings limited to the capture ``span`` (trace clock), with a row at each end.

    ``aligned``: ``device, t_ns, power_w, energy_mj, source`` of log rows. A log runs longer
    than the trace; energy outside the capture is no part of the run. Readings outside
    ``[start, end]`` are left out, and where a GPU has readings either side of an end, a row is
    put at the end (``reading`` false: counted in no phase's samples or peak) that keeps the
    energy rule of a phase end: the running total interpolated linearly between the two
    readings around it (a counter: the counter interpolated; power alone: the start row
    carries the reading before it, the end row the one after, so the trapezoid over the cut
    interval is its mean power times the time inside). Energy up to the ends is then exactly
    what a phase spanning the capture gets. One line per log with readings outside.
    """
    lo, hi = span
    t = pl.col("t_ns")
    ends = [_end_row(aligned, lo, start=True), _end_row(aligned, hi, start=False)]
    inside = aligned.filter(t.is_between(lo, hi)).with_columns(pl.lit(True).alias("reading"))
    clipped = pl.concat([inside, *ends], how="diagonal_relaxed").sort("device", "t_ns")
    counts = aligned.group_by("source").agg(
        pl.len().alias("n"), (~t.is_between(lo, hi)).sum().alias("out")
    )
    notes = [
        f"power log {Path(source).name.split(',')[0]}: {out:,} of {n:,} readings outside the "
        f"capture ({lo / 1e9:.3f} s to {hi / 1e9:.3f} s on the trace clock) left out; energy "
        "up to the capture's ends interpolated between the readings either side"
        for source, n, out in counts.sort("source").iter_rows()
        if out
    ]
    return clipped, notes


def _end_row(aligned: pl.DataFrame, at: int, *, start: bool) -> pl.DataFrame:
    """Per GPU with readings either side of ``at`` and none at it: the row at ``at``."""
    t = pl.col("t_ns")

    def side(name: str, before: bool) -> pl.Expr:
        picked = pl.col(name).filter(t < at if before else t > at)
        return picked.last() if before else picked.first()

    per = (
        aligned.sort("device", "t_ns")
        .group_by("device", maintain_order=True)
        .agg(
            *(side(c, True).alias(f"{c}0") for c in ("t_ns", "power_w", "energy_mj")),
            *(side(c, False).alias(f"{c}1") for c in ("t_ns", "power_w", "energy_mj")),
            (t == at).any().alias("hit"),
            pl.col("source").first(),
        )
        .filter(pl.col("t_ns0").is_not_null() & pl.col("t_ns1").is_not_null() & ~pl.col("hit"))
    )
    f = (at - pl.col("t_ns0")) / (pl.col("t_ns1") - pl.col("t_ns0"))
    counter = pl.col("energy_mj0") + (pl.col("energy_mj1") - pl.col("energy_mj0")) * f
    return per.select(
        "device",
        pl.lit(at, dtype=pl.Int64).alias("t_ns"),
        pl.col("power_w0" if start else "power_w1").alias("power_w"),
        counter.cast(pl.Float64).alias("energy_mj"),
        "source",
        pl.lit(False).alias("reading"),
    )
