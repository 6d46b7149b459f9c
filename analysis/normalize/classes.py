"""Kinds of GPU operation, as the phase table reports them."""

from __future__ import annotations

from enum import Enum

import polars as pl


class OpClass(str, Enum):
    """Class of one GPU operation. ``nccl`` kernels are also counted in ``kernel_ns``."""

    COMPUTE = "compute"
    NCCL = "nccl"
    MEMCPY_H2D = "memcpy_h2d"
    MEMCPY_D2H = "memcpy_d2h"
    MEMCPY_D2D = "memcpy_d2d"
    MEMCPY_P2P = "memcpy_p2p"
    MEMCPY_OTHER = "memcpy_other"
    MEMSET = "memset"
    #: a whole CUDA graph execution (``--cuda-graph-trace=graph``): its kernels are not listed
    CUDA_GRAPH = "cuda_graph"


#: Kernel-name prefixes of NCCL collectives/point-to-point (older NCCL, then NCCL ≥ 2.19).
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")

#: ENUM_CUDA_MEMCPY_OPER ids → class (arrays count as device memory; UVM as the direction it moves).
MEMCPY_KIND_CLASS: dict[int, OpClass] = {
    1: OpClass.MEMCPY_H2D,
    2: OpClass.MEMCPY_D2H,
    3: OpClass.MEMCPY_H2D,
    4: OpClass.MEMCPY_D2H,
    5: OpClass.MEMCPY_D2D,
    6: OpClass.MEMCPY_D2D,
    7: OpClass.MEMCPY_D2D,
    8: OpClass.MEMCPY_D2D,
    9: OpClass.MEMCPY_OTHER,
    10: OpClass.MEMCPY_P2P,
    11: OpClass.MEMCPY_H2D,
    12: OpClass.MEMCPY_D2H,
    13: OpClass.MEMCPY_D2D,
}

OP_CLASS_DTYPE = pl.Enum([c.value for c in OpClass])


def kernel_class_expr(name: pl.Expr) -> pl.Expr:
    """``nccl`` for NCCL kernel names, else ``compute``."""
    is_nccl = pl.any_horizontal(*(name.str.starts_with(p) for p in NCCL_PREFIXES))
    return (
        pl.when(is_nccl).then(pl.lit(OpClass.NCCL.value)).otherwise(pl.lit(OpClass.COMPUTE.value))
    )


def memcpy_class_expr(copy_kind: pl.Expr) -> pl.Expr:
    """Memcpy class from ``copyKind``; unknown kinds become ``memcpy_other``."""
    return copy_kind.replace_strict(
        {k: v.value for k, v in MEMCPY_KIND_CLASS.items()},
        default=OpClass.MEMCPY_OTHER.value,
        return_dtype=pl.String,
    )
