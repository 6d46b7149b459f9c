"""One PyTorch profiler (Kineto) Chrome trace → the rows of the nsys tables the analysis reads.

Kineto writes ``{"traceEvents": [...], "deviceProperties": [...], "distributedInfo": {...},
"baseTimeNanoseconds": N, ...}`` (``.json`` or ``.json.gz``). The file is parsed once, with the
stdlib ``json`` and every non-integer number kept as its decimal text, so that timestamps become
integer nanoseconds exactly: ``ts`` and ``dur`` are microseconds (integers in 2021-2023 traces,
decimals with up to 3 places since), converted each on its own to the nearest ns (ties to even);
an event's end is its start plus its rounded ``dur``, so durations are Kineto's ``dur`` to the ns.

Which events become which rows (categories matched case-insensitively; 2021 traces say
``Kernel``/``Runtime``/``Memcpy``/``Memset``):

- ``user_annotation`` and ``record_function`` (``record_function`` scopes, ``ProfilerStep#N``) →
  NVTX push/pop ranges on their process and thread; ``gpu_user_annotation`` (the same scopes
  projected onto a GPU stream by Kineto) are counted but not ranges: the CPU range is the one
  nsys would record, and attribution projects it onto the GPU itself;
- ``kernel``, ``gpu_memcpy``, ``gpu_memset`` → GPU operations (device ``args.device``, stream
  ``args.stream``, ``args.correlation``, ``args.bytes``); memcpy direction from the name;
- ``cuda_runtime`` and ``cuda_driver`` with ``args.correlation`` → the launching calls;
- ``ph: i`` ``[memory]`` events of a GPU (``Device Type`` 1, CUDA, or 6, HIP) → memory
  allocations (``Bytes`` > 0) and frees (``Bytes`` < 0) with the allocator's ``Total Allocated``
  after the event (CPU memory events, ``Device Type`` 0, are skipped);
- ``ph: M`` ``process_name``/``thread_name`` → process and thread names; the ``Trace`` span
  (``PyTorch Profiler (N)``) → the capture window.
"""

from __future__ import annotations

import decimal
import gzip
import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RANGE_CATS = frozenset({"user_annotation", "record_function"})
GPU_RANGE_CATS = frozenset({"gpu_user_annotation"})
KERNEL_CATS = frozenset({"kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
#: ``ts`` above this (µs) is a UNIX epoch time (after 1973): traces without ``baseTimeNanoseconds``
EPOCH_US = 10**14
#: c10::DeviceType of the GPUs whose ``[memory]`` events are read (CUDA, HIP)
GPU_DEVICE_TYPES = frozenset({1, 6})
#: ENUM_CUDA_MEMCPY_OPER ids by the direction Kineto writes in a memcpy's name
COPY_KINDS = {
    "HtoD": 1,
    "DtoH": 2,
    "HtoA": 3,
    "AtoH": 4,
    "AtoA": 5,
    "AtoD": 6,
    "DtoA": 7,
    "DtoD": 8,
    "HtoH": 9,
    "PtoP": 10,
}
_COPY_RE = re.compile(r"\b(" + "|".join(COPY_KINDS) + r")\b")
_DIGITS = re.compile(r"(\d+)")
_CTX = decimal.Context(prec=40, rounding=decimal.ROUND_HALF_EVEN)


class KinetoFormatError(ValueError):
    """The file is not a readable Kineto trace; the message is the reason, one line."""


def load_document(path: Path) -> dict[str, Any]:
    """The trace's top-level object (``traceEvents`` checked), numbers with decimals as text."""
    try:
        with path.open("rb") as fh:
            data = fh.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise KinetoFormatError(f"truncated or corrupt gzip: {exc}") from exc
    except OSError as exc:
        raise KinetoFormatError(exc.strerror or type(exc).__name__) from exc
    try:
        doc = json.loads(data.decode("utf-8", errors="replace"), parse_float=str)
    except json.JSONDecodeError as exc:
        raise KinetoFormatError(f"invalid JSON: {exc}") from exc
    if isinstance(doc, list):  # a bare event array (Chrome's other trace layout)
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise KinetoFormatError("JSON without a traceEvents list: not a PyTorch profiler trace")
    return doc


def to_ns(value: Any) -> int | None:
    """Microseconds (an int, or decimal text) → integer ns, nearest (ties to even)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, (str, float)):
        try:
            exact = _CTX.multiply(decimal.Decimal(value), 1000)
            return int(exact.to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
        except (decimal.InvalidOperation, ValueError, OverflowError):
            return None
    return None


def as_int(value: Any) -> int | None:
    """An integer field (pid, tid, device, stream, correlation, bytes); digits in text too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            number = decimal.Decimal(text)
        except decimal.InvalidOperation:
            return None
        return int(number) if number == number.to_integral_value() else None
    return None


@dataclass
class Rows:
    """Column lists of one table, filled event by event."""

    columns: tuple[str, ...]
    data: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {c: [] for c in self.columns}

    def add(self, *values: Any) -> None:
        """Append one row (values in column order)."""
        for column, value in zip(self.columns, values, strict=True):
            self.data[column].append(value)

    def __len__(self) -> int:
        return len(self.data[self.columns[0]])


@dataclass
class Parsed:
    """The rows of one trace, timestamps in ns on the trace's clock (``ts`` × 1000)."""

    doc_meta: dict[str, Any]
    strings: dict[str, int] = field(default_factory=dict)
    ranges: Rows = field(default_factory=lambda: Rows(("start", "dur", "pid", "tid", "textId")))
    ops: dict[str, Rows] = field(
        default_factory=lambda: {
            kind: Rows(("start", "dur", "deviceId", "streamId", "correlationId", "nameId", "bytes"))
            for kind in ("kernel", "memcpy", "memset")
        }
    )
    runtime: Rows = field(
        default_factory=lambda: Rows(("start", "dur", "pid", "tid", "correlationId", "nameId"))
    )
    #: ``[memory]`` events of GPUs: signed ``Bytes`` (frees < 0), ``Total Allocated`` after it
    memory: Rows = field(
        default_factory=lambda: Rows(("start", "pid", "deviceId", "delta", "totalAllocated"))
    )
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    #: (start ns, end ns) of each ``Trace`` span (the profiling window)
    windows: list[tuple[int, int]] = field(default_factory=list)
    first_ns: int | None = None
    n_gpu_ranges: int = 0
    n_skipped: int = 0
    named_tids: dict[str, int] = field(default_factory=dict)

    def string_id(self, text: str) -> int:
        """The id of ``text`` in the string table (added on first use)."""
        return self.strings.setdefault(text, len(self.strings))

    def thread_id(self, value: Any) -> int:
        """A numeric thread id; non-numeric thread names get ids of their own (2^23 upward)."""
        number = as_int(value)
        if number is not None:
            return number
        return self.named_tids.setdefault(str(value), (1 << 23) + len(self.named_tids))


def parse(doc: dict[str, Any]) -> Parsed:
    """Every event of ``doc`` that the analysis uses, as rows (see the module docstring)."""
    parsed = Parsed({k: v for k, v in doc.items() if k != "traceEvents"})
    for event in doc["traceEvents"]:
        if isinstance(event, dict):
            _event(parsed, event)
    return parsed


def _event(parsed: Parsed, event: dict[str, Any]) -> None:
    ph = event.get("ph")
    if ph == "M":
        _metadata(parsed, event)
        return
    if ph == "i" and event.get("name") == "[memory]":
        _memory(parsed, event)
        return
    if ph != "X":
        return
    start, dur = to_ns(event.get("ts")), to_ns(event.get("dur", 0))
    if start is None or dur is None:
        parsed.n_skipped += 1
        return
    if parsed.first_ns is None or start < parsed.first_ns:
        parsed.first_ns = start
    cat = str(event.get("cat", "")).lower()
    name = str(event.get("name", ""))
    args = _args(event)
    if cat in RANGE_CATS:
        pid = as_int(event.get("pid"))
        parsed.ranges.add(
            start, dur, pid, parsed.thread_id(event.get("tid")), parsed.string_id(name)
        )
    elif cat in GPU_RANGE_CATS:
        parsed.n_gpu_ranges += 1
    elif cat in RUNTIME_CATS:
        parsed.runtime.add(
            start,
            dur,
            as_int(event.get("pid")),
            parsed.thread_id(event.get("tid")),
            as_int(args.get("correlation")),
            parsed.string_id(name),
        )
    elif cat == "trace":
        parsed.windows.append((start, start + dur))
    else:
        kind = _op_kind(cat)
        if kind is not None:
            _gpu_op(parsed, kind, event, args, (start, dur), name)


def _memory(parsed: Parsed, event: dict[str, Any]) -> None:
    args = _args(event)
    start, delta = to_ns(event.get("ts")), as_int(args.get("Bytes"))
    if as_int(args.get("Device Type")) not in GPU_DEVICE_TYPES or start is None or delta is None:
        return
    parsed.memory.add(
        start,
        as_int(event.get("pid")),
        as_int(args.get("Device Id")),
        delta,
        as_int(args.get("Total Allocated")),
    )


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _op_kind(cat: str) -> str | None:
    if cat in KERNEL_CATS:
        return "kernel"
    if cat in MEMCPY_CATS:
        return "memcpy"
    if cat in MEMSET_CATS:
        return "memset"
    return None


def _gpu_op(
    parsed: Parsed,
    kind: str,
    event: dict[str, Any],
    args: dict[str, Any],
    span: tuple[int, int],
    name: str,
) -> None:
    device = as_int(args.get("device"))
    if device is None:
        device = as_int(event.get("pid"))
    stream = as_int(args.get("stream"))
    if stream is None:  # 2021 traces: tid "stream 7"
        found = _DIGITS.search(str(event.get("tid", "")))
        stream = int(found.group(1)) if found else None
    parsed.ops[kind].add(
        span[0],
        span[1],
        device,
        stream,
        as_int(args.get("correlation")),
        parsed.string_id(name),
        as_int(args.get("bytes")),
    )


def _metadata(parsed: Parsed, event: dict[str, Any]) -> None:
    label = _args(event).get("name")
    pid = as_int(event.get("pid"))
    if not isinstance(label, str) or pid is None:
        return
    if event.get("name") == "process_name":
        parsed.process_names.setdefault(pid, label)
    elif event.get("name") == "thread_name":
        parsed.thread_names.setdefault((pid, parsed.thread_id(event.get("tid"))), label)


def copy_kind(name: str) -> int:
    """The ENUM_CUDA_MEMCPY_OPER id of a memcpy named ``Memcpy HtoD (…)``; 0 when unknown."""
    found = _COPY_RE.search(name)
    return COPY_KINDS[found.group(1)] if found else 0


def device_properties(meta: dict[str, Any]) -> list[tuple[int, str]]:
    """``(id, name)`` of each GPU in ``deviceProperties``."""
    devices = meta.get("deviceProperties")
    found: list[tuple[int, str]] = []
    for device in devices if isinstance(devices, list) else []:
        if isinstance(device, dict) and as_int(device.get("id")) is not None:
            found.append((int(device["id"]), str(device.get("name") or "")))
    return found


def distributed(meta: dict[str, Any]) -> dict[str, str]:
    """Rank, world size and backend from ``distributedInfo`` (empty when absent)."""
    info = meta.get("distributedInfo")
    if not isinstance(info, dict):
        return {}
    keys: Iterable[str] = ("rank", "world_size", "backend", "nccl_version")
    return {k: str(info[k]) for k in keys if info.get(k) is not None}
