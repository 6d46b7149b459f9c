"""Which columns are read from which export table, and how nsys versions name them.

Declaring columns per table (as NVIDIA's recipe data service does) keeps reads narrow and makes
a schema variant fail with the table and column named, never with a wrong number.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TableSpec:
    """Columns to read from one export table.

    ``required`` columns must exist; ``optional`` ones are read when present and null-filled
    otherwise. ``aliases`` maps our column name to names other nsys versions use for it.
    """

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Alternative table names in other nsys versions, tried in order after ``name``.
    alt_names: tuple[str, ...] = ()
    #: TEXT columns: read as bytes and decoded leniently (real files hold invalid UTF-8).
    text: tuple[str, ...] = ()


NVTX_EVENTS = TableSpec(
    "NVTX_EVENTS",
    required=("start", "end", "eventType", "globalTid"),
    optional=(
        "text",
        "textId",
        "domainId",
        "rangeId",
        "endGlobalTid",
        "int64Value",
        "uint64Value",
        "int32Value",
        "uint32Value",
        "category",
    ),
    text=("text",),
)
_GPU_OP_COMMON = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
KERNELS = TableSpec(
    "CUPTI_ACTIVITY_KIND_KERNEL",
    required=(*_GPU_OP_COMMON, "demangledName"),
    optional=("shortName",),
)
RUNTIME = TableSpec(
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    required=("start", "end", "globalTid", "correlationId"),
    optional=("nameId",),
)
MEMCPY = TableSpec(
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    required=(*_GPU_OP_COMMON, "bytes", "copyKind"),
    optional=("srcDeviceId", "dstDeviceId"),
)
MEMSET = TableSpec("CUPTI_ACTIVITY_KIND_MEMSET", required=(*_GPU_OP_COMMON, "bytes"))
#: Whole CUDA graph executions, recorded instead of their kernels under
#: ``--cuda-graph-trace=graph`` (nsys 2023+; columns as in export schema 3.16).
GRAPH_TRACE = TableSpec(
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
    required=(*_GPU_OP_COMMON,),
    optional=("graphId", "graphExecId"),
)
STRING_IDS = TableSpec("StringIds", required=("id", "value"), text=("value",))
SESSION_START = TableSpec(
    "TARGET_INFO_SESSION_START_TIME", required=("utcEpochNs",), optional=("systemClockNs",)
)
ANALYSIS_DETAILS = TableSpec("ANALYSIS_DETAILS", required=("duration",), optional=("startTime",))
PROCESSES = TableSpec(
    "PROCESSES", required=("globalPid", "pid"), optional=("name",), text=("name",)
)
THREAD_NAMES = TableSpec("ThreadNames", required=("nameId", "globalTid"))
EXPORT_META = TableSpec(
    "META_DATA_EXPORT",
    required=("name", "value"),
    alt_names=("EXPORT_META_DATA",),
    text=("name", "value"),
)
SYSTEM_ENV = TableSpec("TARGET_INFO_SYSTEM_ENV", required=("name", "value"), text=("name", "value"))
TARGET_GPU = TableSpec(
    "TARGET_INFO_GPU",
    required=("id",),
    optional=("name", "uuid", "busLocation", "cuDevice"),
    aliases={"id": ("deviceId",)},  # nsys 2021
    text=("name", "uuid", "busLocation"),
)
GPU_METRICS = TableSpec("GPU_METRICS", required=("timestamp", "typeId", "metricId", "value"))
GPU_METRICS_INFO = TableSpec(
    "TARGET_INFO_GPU_METRICS",
    required=("typeId", "metricId", "metricName"),
    optional=("typeName",),
    text=("metricName", "typeName"),
)
#: CUDA memory allocations and frees (``nsys profile --cuda-memory-usage=true``); a Kineto trace's
#: ``[memory]`` events are read as this table too, with the allocator's ``totalAllocated``.
CUDA_MEMORY_USAGE = TableSpec(
    "CUDA_GPU_MEMORY_USAGE_EVENTS",
    required=("start", "deviceId", "bytes", "memKind", "memoryOperationType"),
    optional=("globalPid", "totalAllocated"),
)

#: Tables an export lacks when the capture did not collect that kind of data; their absence is
#: reported in ``summary.json`` and as a warning, and analysis goes on without them.
DATA_TABLES: tuple[TableSpec, ...] = (NVTX_EVENTS, KERNELS, RUNTIME, MEMCPY, MEMSET)
#: Tables that only some captures produce; their absence is normal and not reported.
OPTIONAL_DATA_TABLES: tuple[TableSpec, ...] = (GRAPH_TRACE,)
