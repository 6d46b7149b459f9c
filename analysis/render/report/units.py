"""Tables in human units for the report: ms/s, MB, J, W, % — never raw ns or bytes.

:func:`humanize` turns a frame of the analysis' own columns (``*_ns``, ``*_bytes``, ``*_j``,
``*_w``, ``*_pct``, ``*_fraction``, ``* ms``) into a :class:`ReportTable`: a frame in display
units whose column names carry the unit (``wall_ms``, ``gen_start_s``, ``memcpy_mb``), written
as the CSV beside the report, and per column the label and the cell format of the HTML and
Markdown tables. Each column group (a metric and its ``_p10``/``_p90``) gets one unit and one
number of decimals, chosen from its largest value, so a column reads in one unit throughout.
Times named ``*start*``/``*end*`` are offsets on the run's clock (from the capture's start).
A cell never shows a wrong ``0`` or ``100%`` (:func:`fixed`): a phase that ran 0.11 ms in a
column of seconds to 3 decimals reads ``<0.001 s``, a 99.53% busy reads ``99.5%``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

#: a report section: its title and its table (in the tables' own units)
Section = tuple[str, pl.DataFrame]

#: what a missing value shows in the report's tables
MISSING = "—"
#: most rows a table shows in the report (its CSV has them all)
MAX_SHOWN_ROWS = 200
#: columns that are identifiers: printed as they are (no thousands separators)
ID_COLUMNS = frozenset({"step", "pid", "rank", "#", "device", "tid", "n_steps", "steps"})
_STATS = ("_p10", "_p90", "_median")


def fixed(value: float, digits: int, *, sign: bool = False, pct: bool = False) -> str:
    """``value`` with ``digits`` decimals (thousands separated), never a wrong ``0`` or ``100``.

    An exact zero is ``0``. A nonzero value that would round to zero is ``<`` the column's
    smallest step: ``<0.001`` (``digits`` 3), ``<1`` (``digits`` 0), ``-<0.001`` when
    negative (never ``-0.000``). ``sign``: a ``+`` before positive values (``+<0.01``).
    ``pct``: a percentage that is not 100 but would round to it gets more decimals, up to
    three more (``99.53`` → ``99.5``, never ``100``), else ``>99.999`` (``>100`` above it).
    """
    plus = "+" if sign else ""
    if value == 0:
        return "0"
    if round(value, digits) == 0:
        smallest = f"{10.0**-digits:.{digits}f}"
        return f"-<{smallest}" if value < 0 else f"{plus}<{smallest}"
    if pct and value != 100 and round(value, digits) == 100:
        for more in range(digits + 1, digits + 4):
            if round(value, more) != 100:
                return f"{value:{plus},.{more}f}"
        return (
            f"{plus}>{100 - 10.0 ** -(digits + 3):.{digits + 3}f}" if value < 100 else f"{plus}>100"
        )
    return f"{value:{plus},.{digits}f}"


def duration(seconds: float, significant: int = 4) -> str:
    """A time in seconds in the unit that reads best, ``significant`` digits: ``15.26 µs``.

    ``s`` from 1 s, ``ms`` from 1 ms, else ``µs`` (``ns`` below 1 µs); an exact zero is ``0 s``.
    """
    if seconds == 0:
        return "0 s"
    # rounded to its digits first, so 0.99996 ms reads 1.000 ms, not 1,000.0 µs
    rounded = float(f"{seconds:.{significant - 1}e}")
    exponent = int(f"{rounded:e}".split("e")[1])
    unit, scale = next(
        ((u, e) for u, e in (("s", 0), ("ms", -3), ("µs", -6)) if exponent >= e), ("ns", -9)
    )
    digits = max(0, significant - 1 - (exponent - scale))
    return f"{rounded / 10.0**scale:,.{digits}f} {unit}"


@dataclass(frozen=True)
class Column:
    """One column of a report table: its CSV name, header label, unit and decimals."""

    name: str
    label: str
    unit: str = ""
    digits: int | None = None  # None: not a float (text, integer, boolean)

    def cell(self, value: object) -> str:
        """``value`` as the report shows it (``12.34 ms``, ``67%``, ``<0.001 s``, ``—`` missing).

        Floats follow :func:`fixed`: a ran-but-tiny value is ``<0.001 s``, never ``0 s``.
        """
        if value is None or (isinstance(value, float) and value != value):
            return MISSING
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int) and self.digits is None:
            text = str(value) if self.name in ID_COLUMNS else f"{value:,}"
        elif isinstance(value, int | float) and self.digits is not None:
            text = fixed(value, self.digits, pct=self.unit == "%")
        elif isinstance(value, float):
            text = f"{value:,.4g}"
        else:
            return str(value)
        if not self.unit:
            return text
        return f"{text}{self.unit}" if self.unit == "%" else f"{text} {self.unit}"


@dataclass
class ReportTable:
    """A titled table in display units; ``frame`` is what its CSV holds."""

    title: str
    frame: pl.DataFrame
    columns: list[Column]
    notes: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        """The CSV's file name stem: the title before any ``(``, lower case, joined by ``_``."""
        short = self.title.split(" (")[0] or self.title
        return re.sub(r"[^a-z0-9]+", "_", short.lower()).strip("_")[:60] or "table"

    def is_text(self, column: Column) -> bool:
        """Whether ``column`` holds text (left-aligned), not numbers."""
        dtype = self.frame.schema[column.name]
        return not dtype.is_numeric() or dtype == pl.Boolean

    def rows(self) -> list[list[str]]:
        """Each shown row's cells as text, in column order (the first :data:`MAX_SHOWN_ROWS`)."""
        return [
            [c.cell(v) for c, v in zip(self.columns, row, strict=True)]
            for row in self.frame.head(MAX_SHOWN_ROWS).iter_rows()
        ]


def _decimals(largest: float) -> int:
    """Decimals for a column whose largest magnitude is ``largest`` (about 3–4 digits)."""
    if largest >= 1000:
        return 0
    if largest >= 100:
        return 1
    return 2 if largest >= 1 else 3


def _split(name: str) -> tuple[str, str]:
    """(base, stat suffix): ``wall_ns_p10`` → (``wall_ns``, ``_p10``)."""
    for stat in _STATS:
        if name.endswith(stat):
            return name[: -len(stat)], stat
    return name, ""


@dataclass(frozen=True)
class _Unit:
    kind: str  # time, offset, bytes, energy, power, pct, fraction, plain
    stem: str  # the name without its unit suffix
    exponent: int  # the power of ten to the kind's base unit (ms, MB, J, W, %)


_SUFFIXES: tuple[tuple[str, str, int], ...] = (  # suffix, kind, power of ten to the base unit
    ("_ns", "time", -6),
    ("_us", "time", -3),
    (" µs", "time", -3),
    ("_ms", "time", 0),
    (" ms", "time", 0),
    ("_s", "time", 3),
    ("_bytes", "bytes", -6),
    ("_mb", "bytes", 0),
    (" MB", "bytes", 0),
    ("_j_per_token", "energy_per_token", 3),
    ("_j", "energy", 0),
    (" J", "energy", 0),
    ("_w", "power", 0),
    (" W", "power", 0),
    ("_pct", "pct", 0),
    (" %", "pct", 0),
    ("_fraction", "pct", 2),
)


def _unit_of(base: str) -> _Unit:
    if "_per_" in base and not base.endswith("_j_per_token"):  # tokens_per_gen_j: a rate
        return _Unit("plain", base, 0)
    for suffix, kind, factor in _SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            stem = base[: -len(suffix)]
            if kind == "time" and re.search(r"(^|_)(start|end)($|_)", stem):
                kind = "offset"
            return _Unit(kind, stem, factor)
    return _Unit("plain", base, 0)


def _time_unit(largest_ms: float) -> tuple[str, int]:
    """(unit, power of ten from ms) for a time column: s from 10 s, µs below 1 ms, else ms."""
    if largest_ms >= 10_000:
        return "s", -3
    if 0 < largest_ms < 1:
        return "µs", 3
    return "ms", 0


def _scaled(expr: pl.Expr, exponent: int) -> pl.Expr:
    """``expr × 10**exponent`` to 12 significant digits: 5150000 ns is 5.15 ms, not 5.1499….

    (Polars divides columns by multiplying with the reciprocal; the rounding undoes that.)
    """
    expr = expr.cast(pl.Float64)
    if exponent == 0:
        return expr
    scaled = expr * 10**exponent if exponent > 0 else expr / 10 ** (-exponent)
    return scaled.round_sig_figs(12)


_BASE_UNITS = {
    "bytes": ("MB", "mb"),
    "energy": ("J", "j"),
    "energy_per_token": ("mJ/token", "mj_per_token"),
    "power": ("W", "w"),
    "pct": ("%", "pct"),
}


def _magnitudes(frame: pl.DataFrame, names: list[str], exponent: int) -> tuple[float, float]:
    """(largest, typical) magnitude of the group's values × 10**exponent.

    typical: the median of the non-zero magnitudes (the decimals follow it, so a column of
    mostly small values keeps its digits), 0 when every value is 0 or missing.
    """
    values = pl.concat([frame[n].cast(pl.Float64).abs().drop_nulls() for n in names])
    nonzero = values.filter(values > 0)
    largest = float(values.max() or 0.0) if values.len() else 0.0
    typical = float(nonzero.median() or 0.0) if nonzero.len() else 0.0
    return largest * 10.0**exponent, typical * 10.0**exponent


def _group_columns(
    frame: pl.DataFrame, base: str, names: list[str], labels: dict[str, str]
) -> tuple[list[pl.Expr], list[Column]]:
    """Expressions and columns for one column group (a metric and its p10/p90)."""
    unit = _unit_of(base)
    dtype = frame.schema[names[0]]
    numeric = dtype.is_numeric() and dtype != pl.Boolean
    if unit.kind == "plain" or not numeric:
        exprs = [pl.col(n) for n in names]
        return exprs, [Column(n, labels.get(n, n.replace("_", " "))) for n in names]
    largest, typical = _magnitudes(frame, names, unit.exponent)
    scale = 0
    if unit.kind in ("time", "offset"):
        symbol, scale = _time_unit(largest)
        suffix = {"ms": "ms", "s": "s", "µs": "us"}[symbol]
        largest *= 10.0**scale
        typical *= 10.0**scale
    else:
        symbol, suffix = _BASE_UNITS[unit.kind]
    digits = _decimals(typical)
    if unit.kind == "offset":  # a point in time: to the ms in s, to 10 µs in ms
        digits = 3 if symbol == "s" else 2
    if unit.kind in ("pct", "power"):  # 67%, 693 W: a decimal more says nothing
        digits = 0 if largest >= 10 else min(digits, 1)
    exprs, cols = [], []
    for n in names:
        _, stat = _split(n)
        new = f"{unit.stem.replace(' ', '_')}_{suffix}{stat}"
        exprs.append(_scaled(pl.col(n), unit.exponent + scale).alias(new))
        stem = unit.stem + (" energy per token" if unit.kind == "energy_per_token" else "")
        label = labels.get(n, (stem + stat.replace("_", " ")).replace("_", " "))
        cols.append(Column(new, label, symbol, digits))
    return exprs, cols


def humanize(
    title: str,
    frame: pl.DataFrame,
    *,
    labels: dict[str, str] | None = None,
    notes: list[str] | None = None,
    drop_empty: bool = False,
) -> ReportTable:
    """``frame`` in display units (see the module docstring); ``labels``: header overrides.

    ``drop_empty``: leave out numeric columns without a single value (no power: no energy).
    """
    labels = labels or {}
    if drop_empty:
        empty = [
            n
            for n, dtype in frame.schema.items()
            if dtype.is_numeric() and frame[n].null_count() == frame.height
        ]
        frame = frame.drop(empty)
    groups: dict[str, list[str]] = {}
    for name in frame.columns:
        base, _ = _split(name)
        groups.setdefault(base if base in frame.columns else name, []).append(name)
    exprs: list[pl.Expr] = []
    columns: list[Column] = []
    for base, names in groups.items():
        more_exprs, more_cols = _group_columns(frame, base, names, labels)
        exprs += more_exprs
        columns += more_cols
    notes = list(notes or [])
    if frame.height > MAX_SHOWN_ROWS:
        notes.append(f"The first {MAX_SHOWN_ROWS} of {frame.height:,} rows; the CSV has them all.")
    if any(_unit_of(_split(n)[0]).kind == "offset" for n in frame.columns):
        notes.append("start/end: time from the start of the capture (the run's clock)")
    return ReportTable(title, frame.select(exprs), columns, notes)
