"""The nsys export schema the synthetic exports are made from: DDL, ENUM rows, column lists.

The DDL is that of a real nsys 2022.4.2 export (``schema/nsys-schema-2022.4.2.sql``, with its
ENUM rows in ``schema/nsys-enums-2022.4.2.sql``) plus the graph-trace table of nsys 2024.x
(``schema/nsys-graph-trace-2024.sql``), never invented columns.
"""

from __future__ import annotations

import re
from importlib import resources

#: Tables every synthetic export has (exports are lazy: only tables with rows, and the ENUMs).
TABLES = {
    "ANALYSIS_DETAILS",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "EXPORT_META_DATA",
    "NVTX_EVENTS",
    "PROCESSES",
    "StringIds",
    "TARGET_INFO_SESSION_START_TIME",
    "ThreadNames",
    "TARGET_INFO_SYSTEM_ENV",
}
GRAPH_TRACE_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"

_GPU_COMMON = ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid")
KERNEL_COLUMNS = (
    *_GPU_COMMON,
    "demangledName",
    "shortName",
    "registersPerThread",
    "gridX",
    "gridY",
    "gridZ",
    "blockX",
    "blockY",
    "blockZ",
    "staticSharedMemory",
    "dynamicSharedMemory",
    "localMemoryPerThread",
    "localMemoryTotal",
    "gridId",
)
MEMCPY_COLUMNS = (*_GPU_COMMON, "bytes", "copyKind", "srcDeviceId", "dstDeviceId")
MEMSET_COLUMNS = (*_GPU_COMMON, "value", "bytes", "memKind")
GRAPH_COLUMNS = (*_GPU_COMMON, "graphId", "graphExecId")

_CREATE = r"(CREATE TABLE (\w+) \(.*?\n\);)"


def _schema_file(name: str) -> str:
    return resources.files("nvtx_phases.analysis.synth").joinpath(f"schema/{name}").read_text()


def ddl(tables: set[str]) -> str:
    """The 2022.4.2 ``CREATE TABLE`` statements of ``tables`` and of every ENUM table."""
    text = _schema_file("nsys-schema-2022.4.2.sql")
    chosen = [
        statement
        for statement, name in re.findall(_CREATE, text, flags=re.S)
        if name in tables or name.startswith("ENUM_")
    ]
    return "\n".join(chosen)


def graph_trace_ddl() -> str:
    """``CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` as nsys 2024.x writes it."""
    ((statement, _),) = re.findall(_CREATE, _schema_file("nsys-graph-trace-2024.sql"), flags=re.S)
    return statement


def enum_rows() -> str:
    """The ``INSERT`` statements filling the ENUM tables, as in the 2022.4.2 export."""
    return _schema_file("nsys-enums-2022.4.2.sql")


def insert(table: str, columns: tuple[str, ...]) -> str:
    """``INSERT INTO table (columns) VALUES (?, …)``."""
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
