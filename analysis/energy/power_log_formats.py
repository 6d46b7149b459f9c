"""Parsers for power logs written by other tools: each returns GPU power readings on UTC.

Every parser returns :data:`LOG_SCHEMA` rows (``device``: the tool's GPU index, ``uuid``,
``wall_ns``: UTC epoch ns, ``power_w``, ``energy_mj``: a total-energy counter where the log has
one) and a description of the columns it read. Formats (checked against the tools' sources):

- ``nvidia-smi --query-gpu=timestamp,index,uuid,power.draw,… --format=csv[,noheader][,nounits]``:
  comma + space separated, header ``timestamp, index, uuid, power.draw [W]``, values ``59.21 W``
  (``nounits``: ``59.21``), ``[N/A]``/``[Not Supported]`` where there is no reading. The
  timestamp (``2026/12/06 05:17:01.123``) is the logging host's local time with no zone.
- ``dcgmi dmon -e 155,156,…``: whitespace-aligned text; a header ``#Entity POWER TOTEC …`` and a
  units line ``ID W mJ …`` (repeated every 14 rows), rows ``GPU 0 59.213 123456``, ``N/A`` for
  blanks. dmon prints no time (DCGM 4.x: options -i -g -f -e -d -c -l only), so only a log whose
  lines were stamped by the logger (``| ts '%Y-%m-%dT%H:%M:%.S%z'``, or epoch seconds) can be
  placed in time.
- Zeus ``PowerMonitor(power_csv_path=…)`` (Zeus ≤ 0.11): headerless ``unix_time,W,W,…`` rows, one
  column per monitored GPU (``time,power0,power1`` when saved with a header).
"""

from __future__ import annotations

import re

import polars as pl

from ..errors import InputError

LOG_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64(),
    "uuid": pl.String(),
    "wall_ns": pl.Int64(),
    "power_w": pl.Float64(),
    "energy_mj": pl.Int64(),
}

#: DCGM's blank values (``DCGM_FP64_BLANK``; the int64 blanks are larger): never a reading.
DCGM_BLANK = 140737488355328.0
#: Date-time layouts read from logs (``%.f``: an optional fraction).
_NAIVE_FORMATS = ("%Y/%m/%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f")
_EPOCH = r"^\d{9,11}(?:\.\d{1,9})?$"
_ZONE = r"^(.*?\d)\s*(Z|[+-]\d{2}:?\d{2})$"
TZ_HINT = (
    "add the zone to the file name given to --power: 'FILE,tz=UTC' (or tz=+02:00, tz=Europe/Berlin)"
)


def _epoch_ns(text: pl.Series) -> pl.Series:
    """Epoch seconds written as text → ns, exactly (no float rounding)."""
    parts = text.str.split_exact(".", 1)
    seconds = parts.struct.field("field_0").cast(pl.Int64)
    fraction = parts.struct.field("field_1").fill_null("").str.pad_end(9, "0").str.slice(0, 9)
    return seconds * 1_000_000_000 + fraction.cast(pl.Int64)


def _zone_offset_ns(zone: pl.Series) -> pl.Series:
    """``Z``, ``+02:00``, ``-0700`` → the offset east of UTC in ns."""
    digits = zone.str.replace("Z", "+0000").str.replace(":", "")
    sign = pl.when(digits.str.slice(0, 1) == "-").then(-1).otherwise(1)
    minutes = digits.str.slice(1, 2).cast(pl.Int64) * 60 + digits.str.slice(3, 2).cast(pl.Int64)
    return pl.select(sign * minutes * 60_000_000_000).to_series()


def wall_clock_ns(text: pl.Series, tz: str | None, where: str) -> tuple[pl.Series, str]:
    """Timestamps as written → UTC epoch ns, and how they were read.

    Epoch seconds and date-times with a zone (``…+02:00``, ``…Z``) need nothing else; a
    date-time without a zone is read in ``tz`` and refused without one: reading local time as
    UTC would shift every reading by the zone's offset, hours off the trace.
    """
    text = text.str.strip_chars()
    first = text.drop_nulls().head(1).to_list()
    if not first:
        raise InputError(f"{where}: no timestamps")
    if re.match(_EPOCH, first[0]):
        return _epoch_ns(text), "Unix time"
    zoned = text.str.extract_groups(_ZONE)
    if zoned.struct.field("1").null_count() == 0:
        naive = _naive(zoned.struct.field("1"), where)
        return naive - _zone_offset_ns(zoned.struct.field("2")), "date-times with their zone"
    if tz is None:
        raise InputError(
            f"{where}: timestamps like '{first[0]}' are local time without a zone; {TZ_HINT}"
        )
    naive_dt = _naive_datetime(text, where)
    try:
        utc = naive_dt.dt.replace_time_zone(tz, ambiguous="null", non_existent="null")
    except pl.exceptions.PolarsError:
        raise InputError(
            f"{where}: unknown time zone '{tz}' (tz=UTC, +02:00, Europe/Berlin)"
        ) from None
    return utc.dt.epoch("ns"), f"local time read in {tz}"


def _naive_datetime(text: pl.Series, where: str) -> pl.Series:
    for layout in _NAIVE_FORMATS:
        parsed = text.str.strptime(pl.Datetime("ns"), layout, strict=False)
        if parsed.null_count() < text.len() and parsed.null_count() == text.null_count():
            return parsed
    raise InputError(f"{where}: cannot read timestamps like '{text.drop_nulls()[0]}'")


def _naive(text: pl.Series, where: str) -> pl.Series:
    return _naive_datetime(text, where).dt.epoch("ns")


def _number(text: pl.Expr) -> pl.Expr:
    """``'59.21 W'``, ``'59.21'`` → 59.21; ``[N/A]``, ``N/A``, ``[Not Supported]`` → null."""
    return (
        text.str.strip_chars()
        .str.extract(r"^([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
        .cast(pl.Float64)
    )


# --- nvidia-smi ------------------------------------------------------------------------------

#: power columns in order of preference: the instant reading first (``power.draw`` is a ~1 s
#: average on recent GPUs, as is ``power.draw.average``).
SMI_POWER = ("power.draw.instant", "power.draw", "power.draw.average")


def _smi_names(header: list[str]) -> list[tuple[str, str]]:
    """``'power.draw [W]'`` → (``power.draw``, ``W``)."""
    out = []
    for name in header:
        match = re.match(r"^\s*([^\[]+?)\s*(?:\[(.*)\])?\s*$", name)
        out.append((match.group(1), match.group(2) or "") if match else (name.strip(), ""))
    return out


def parse_nvidia_smi(
    lines: pl.Series, tz: str | None, columns: list[str] | None, where: str
) -> tuple[pl.DataFrame, str]:
    """``nvidia-smi --query-gpu=… --format=csv`` rows (``columns``: the query, for ``noheader``)."""
    if columns is None:
        header = _smi_names(lines[0].split(","))
        body = lines.slice(1)
    else:
        header = [(c.strip(), "") for c in columns]
        body = lines
    names = [n for n, _ in header]
    power = next((p for p in SMI_POWER if p in names), None)
    if "timestamp" not in names or power is None:
        raise InputError(
            f"{where}: nvidia-smi CSV without a timestamp and a power.draw column "
            f"(columns: {', '.join(names)}); log with --query-gpu=timestamp,index,uuid,power.draw"
        )
    unit = dict(header)[power]
    fields = body.str.split(",")
    first = body.head(1).str.strip_chars().to_list()
    rows = pl.DataFrame({"f": fields}).filter(
        (pl.col("f").list.len() == len(names))
        & (pl.col("f").list.get(names.index("timestamp")).str.strip_chars() != "timestamp")
    )
    if rows.is_empty():
        raise InputError(f"{where}: no nvidia-smi rows with {len(names)} columns ({first})")

    def col(name: str) -> pl.Expr:
        return pl.col("f").list.get(names.index(name)).str.strip_chars()

    scale = 1e-3 if unit.lower() == "mw" else 1.0
    frame = rows.select(
        (col("index").cast(pl.Int64, strict=False) if "index" in names else pl.lit(None))
        .cast(pl.Int64)
        .alias("device"),
        # "[N/A]" (a vGPU, an old driver) names no GPU: left null, matched by index
        (col("uuid") if "uuid" in names else pl.lit(None))
        .cast(pl.String)
        .str.extract(r"^((?:GPU-|MIG-)?[0-9A-Fa-f][0-9A-Fa-f-]{7,})$")
        .alias("uuid"),
        col("timestamp").alias("ts"),
        (_number(col(power)) * scale).alias("power_w"),
        pl.lit(None, dtype=pl.Int64).alias("energy_mj"),
    )
    wall, how = wall_clock_ns(frame["ts"], tz, where)
    frame = frame.with_columns(wall.alias("wall_ns")).select(list(LOG_SCHEMA))
    return frame, f"{power} [{unit or 'W'}], timestamps: {how}"


# --- dcgmi dmon ------------------------------------------------------------------------------

_ENTITY = (
    r"^(?P<stamp>.*?)\s*(?P<kind>#Entity|ID|Id|GPU-CI|GPU-I|GPU|Switch|vGPU)(?:\s+|$)(?P<rest>.*)$"
)


def parse_dcgm_dmon(lines: pl.Series, tz: str | None, where: str) -> tuple[pl.DataFrame, str]:
    """``dcgmi dmon`` output (``POWER``/``POWINST`` in W, ``TOTEC`` in mJ), stamped per line."""
    parts = pl.DataFrame({"line": lines}).select(
        pl.col("line").str.extract_groups(_ENTITY).alias("m")
    )
    parts = parts.unnest("m").filter(pl.col("kind").is_not_null())
    headers = parts.filter(pl.col("kind") == "#Entity")["rest"].unique(maintain_order=True)
    if headers.len() != 1:
        raise InputError(f"{where}: dcgmi dmon log with {headers.len()} different headers")
    fields = headers[0].split()
    power = next((f for f in ("POWINST", "POWER") if f in fields), None)
    if power is None:
        raise InputError(
            f"{where}: dcgmi dmon log without power (fields {', '.join(fields)}); "
            "log field 155 (POWER) or 157 (POWINST), and 156 (TOTEC) for energy"
        )
    gpus = parts.filter(pl.col("kind") == "GPU")
    if gpus.is_empty():
        raise InputError(f"{where}: dcgmi dmon log without GPU rows")
    if (gpus["stamp"].str.strip_chars() == "").any():
        raise InputError(
            f"{where}: dcgmi dmon prints no timestamps, so its readings cannot be placed on the "
            "trace's clock; stamp each line while logging, e.g. "
            "dcgmi dmon -e 155,156 -d 100 | ts '%Y-%m-%dT%H:%M:%.S%z' > dmon.log"
        )
    values = gpus.select("stamp", pl.col("rest").str.extract_all(r"\S+").alias("v"))
    values = values.filter(pl.col("v").list.len() == len(fields) + 1)

    def value(name: str) -> pl.Expr:
        number = _number(pl.col("v").list.get(fields.index(name) + 1))
        return pl.when(number < DCGM_BLANK).then(number)

    frame = values.select(
        pl.col("v").list.get(0).cast(pl.Int64, strict=False).alias("device"),
        pl.lit(None, dtype=pl.String).alias("uuid"),
        "stamp",
        value(power).alias("power_w"),
        (value("TOTEC").round().cast(pl.Int64) if "TOTEC" in fields else pl.lit(None))
        .cast(pl.Int64)
        .alias("energy_mj"),
    )
    wall, how = wall_clock_ns(frame["stamp"], tz, where)
    frame = frame.with_columns(wall.alias("wall_ns")).select(list(LOG_SCHEMA))
    counter = ", TOTEC [mJ]" if "TOTEC" in fields else ""
    return frame, f"{power} [W]{counter}, timestamps: {how}"


# --- Zeus ------------------------------------------------------------------------------------


def parse_zeus_csv(
    lines: pl.Series, gpus: list[int] | None, where: str
) -> tuple[pl.DataFrame, str]:
    """Zeus ``PowerMonitor`` CSV: ``unix_time,W_gpu_a,W_gpu_b,…`` (``gpus``: the monitored indices)."""
    header = lines[0].split(",") if lines[0].startswith("time") else None
    body = lines.slice(1) if header else lines
    width = len(header) if header else len(body[0].split(","))
    if header:
        indices = [int(re.sub(r"\D", "", name) or -1) for name in header[1:]]
        how = "GPU indices from the header"
        if gpus is not None and gpus != indices:
            raise InputError(
                f"{where}: gpus={'+'.join(map(str, gpus))} but the header names the columns "
                f"{', '.join(header[1:])}: leave out gpus= (the header's indices are used)"
            )
        how += " (gpus= agrees)" if gpus is not None else ""
    else:
        indices = gpus if gpus is not None else list(range(width - 1))
        how = "GPU indices " + ("given" if gpus is not None else "assumed 0, 1, …")
    if len(indices) != width - 1:
        raise InputError(f"{where}: {width - 1} power columns but gpus= names {len(indices)}")
    fields = pl.DataFrame({"f": body.str.split(",")}).filter(pl.col("f").list.len() == width)
    wall = _epoch_ns(fields["f"].list.get(0).str.strip_chars())
    frames = [
        pl.DataFrame(
            {
                "device": pl.Series([index] * fields.height, dtype=pl.Int64),
                "uuid": pl.Series([None] * fields.height, dtype=pl.String),
                "wall_ns": wall,
                "power_w": fields.select(_number(pl.col("f").list.get(k + 1))).to_series(),
                "energy_mj": pl.Series([None] * fields.height, dtype=pl.Int64),
            }
        )
        for k, index in enumerate(indices)
    ]
    return pl.concat(frames), f"power [W] per GPU column ({how}), timestamps: Unix time"
