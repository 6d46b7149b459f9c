"""Names and numbers both synthetic captures share: time units, ids, kernels, streams, copies."""

from __future__ import annotations

from typing import Literal

US = 1_000
MS = 1_000_000
#: ``vmId`` of the one profiled machine; the high bits of every ``globalPid``/``globalTid``.
VM_ID = 1 << 48
#: Session start (UTC ns) of the run clock: the driver's session.
BASE_UTC_NS = 1_790_000_000_000_000_000
DRIVER_PID = 1000

PHASE_GAP_NS = 200 * US
STEP_GAP_NS = 2 * MS

#: Kinds of GPU operation; one CUPTI table each.
OpKind = Literal["kernel", "memcpy", "memset", "graph"]

#: Extra power (W) a GPU draws while a worker range of that phase runs (on top of idle).
PHASE_POWER_W = {
    "generate_sequences": 310.0,
    "compute_log_prob": 230.0,
    "compute_ref_log_prob": 210.0,
    "update_actor": 380.0,
    "update_weights": 160.0,
    "compute_rm_score": 280.0,
}

#: (shortName, demangledName) of the compute kernels, launched round-robin.
COMPUTE_KERNELS = (
    (
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void cutlass::Kernel<gemm_bf16>(Params)",
    ),
    (
        "flash_fwd_kernel",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>(Flash_fwd_params)",
    ),
    (
        "vectorized_elementwise_kernel",
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, at::native::AddFunctor<float>)",
    ),
    (
        "reduce_kernel",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
    ),
)
#: Worker range → the NCCL collective it runs beside its compute kernels.
NCCL_KERNELS = {
    "update_actor": (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
    "update_weights": (
        "ncclDevKernel_Broadcast_RING_LL",
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
    "compute_log_prob": (
        "ncclDevKernel_AllGather_RING_LL",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
}
COMPUTE_STREAM, NCCL_STREAM, COPY_STREAM = 7, 13, 15
COPY_KIND_H2D, COPY_KIND_D2H, COPY_KIND_D2D, COPY_KIND_P2P = 1, 2, 8, 10
#: Runtime API names of the launch calls, as nsys stores them (``nameId`` → ``StringIds``).
LAUNCH_NAMES = {
    "kernel": "cudaLaunchKernel_v7000",
    "memcpy": "cudaMemcpyAsync_v3020",
    "memset": "cudaMemsetAsync_v3020",
    "graph": "cudaGraphLaunch_v10000",
}
