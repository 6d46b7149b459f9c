"""Which physical GPU a GPU operation ran on, across processes and files.

An operation carries only ``deviceId``, the device number nsys gave it in that report. Under Ray
every worker process reports its one GPU as device 0, and a trainer and a rollout process may
share one GPU, each with its own report; so ``(host, deviceId)`` collapses a node's GPUs into one
and ``(file, deviceId)`` splits a shared GPU in two. A report's ``TARGET_INFO_GPU`` names each of
its devices (``id`` = the operations' ``deviceId``, both documented as "Device ID"), with the
GPU's UUID and PCI bus location, which name the physical GPU in every report:

1. ``GPU-<uuid>`` (NVML's and nvidia-smi's spelling) when the report has the GPU's UUID;
2. ``<host>/<bus location>`` when it has only the bus location;
3. ``<file>:<deviceId>`` otherwise (a warning: GPUs shared between files count twice).
"""

from __future__ import annotations

import polars as pl

from ..frames import PolarsDataType
from ..read import specs as T
from ..read.export import RawTrace

#: Per report: ``device_id`` (the operations' deviceId) → ``device`` and what is known of it.
IDENTITY_SCHEMA: dict[str, PolarsDataType] = {
    "device_id": pl.Int64,
    "device": pl.String,
    "identity": pl.String,  # "uuid", "bus" or "file"
    "uuid": pl.String,
    "bus_location": pl.String,
    "gpu_name": pl.String,
}


def normalize_uuid(uuid: pl.Expr) -> pl.Expr:
    """``GPU-<lowercase uuid>``, whether or not the source wrote the ``GPU-`` prefix; null if blank."""
    bare = uuid.str.strip_chars().str.to_lowercase().str.strip_prefix("gpu-")
    usable = bare.is_not_null() & (bare.str.replace_all(r"[-0]", "").str.len_chars() > 0)
    return pl.when(usable).then(pl.lit("GPU-") + bare)


def gpu_identities(raw: RawTrace) -> pl.DataFrame:
    """One row per device the report describes, keyed by ``device_id`` (see module docstring)."""
    gpus = raw.frame(T.TARGET_GPU)
    if gpus is None or gpus.is_empty():
        return pl.DataFrame(schema=IDENTITY_SCHEMA)
    place = raw.host or raw.label
    return (
        gpus.select(
            pl.col("id").cast(pl.Int64).alias("device_id"),
            normalize_uuid(pl.col("uuid")).alias("uuid"),
            pl.col("busLocation").str.strip_chars().replace("", None).alias("bus_location"),
            pl.col("name").alias("gpu_name"),
        )
        .unique(subset="device_id", keep="first", maintain_order=True)
        .with_columns(
            pl.coalesce("uuid", pl.lit(f"{place}/") + pl.col("bus_location")).alias("device"),
            pl.when(pl.col("uuid").is_not_null())
            .then(pl.lit("uuid"))
            .when(pl.col("bus_location").is_not_null())
            .then(pl.lit("bus"))
            .alias("identity"),
        )
        .filter(pl.col("device").is_not_null())
        .select(list(IDENTITY_SCHEMA))
        .cast(IDENTITY_SCHEMA)  # type: ignore[arg-type]
    )


def fallback_device(label: str, device_id: pl.Expr) -> pl.Expr:
    """The device name for an operation whose report does not describe its GPU."""
    return pl.lit(f"{label}:") + device_id.cast(pl.String)


def unidentified_warning(label: str, devices: list[str], identities: pl.DataFrame) -> list[str]:
    """A warning for devices of ``label`` that fell back to ``file:deviceId`` (none if all known)."""
    known = set(identities["device"].to_list())
    fallback = sorted(d for d in devices if d not in known)
    if not fallback:
        return []
    return [
        f"{label}: no GPU UUID or bus location for device(s) "
        f"{', '.join(d.rsplit(':', 1)[-1] for d in fallback)} (no TARGET_INFO_GPU); each counts "
        "as its own GPU, so a GPU shared with another file's process is counted twice"
    ]


def device_label(device: str) -> str:
    """A short name for figures: ``GPU-cf6b97c0`` for a UUID, the name itself otherwise."""
    if device.startswith("GPU-") and len(device) > 12:
        return device[:12]
    return f"GPU {device}"
