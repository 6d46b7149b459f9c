"""A VeRL checkpoint engine ``gloo``: the trainer → rollout weight broadcast of VeRL's ``nccl`` engine, on CPU.

VeRL 0.9.1's disaggregated trainers (``verl.experimental.fully_async_policy``,
``one_step_off_policy``) send the actor's weights to the standalone rollout servers through a
checkpoint engine (``actor_rollout_ref.rollout.checkpoint_engine.backend``). Every engine it
ships needs an accelerator: ``nccl`` (cupy, NCCL), ``nixl``, ``hccl``, ``mooncake``, ``kimi``;
``naive`` only works where actor and rollout share a process. This one follows ``nccl``'s
protocol (``verl/checkpoint_engine/nccl_checkpoint_engine.py``) with gloo: actor rank 0
broadcasts the weights in buckets to every rollout worker over a gloo process group built for
each sync (a ``TCPStore`` the actor's rank 0 opens in :meth:`~GlooCheckpointEngine.prepare`),
each bucket preceded by its metadata (names, shapes, offsets, as ``TensorMeta``). Loaded into
every process through VeRL's own plugin option::

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    +actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=checks.verl_run.cpu_checkpoint_engine

(VeRL imports the module, which registers the class). Written against verl 0.9.1.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)

BACKEND = "gloo"
#: How long a rank waits for the others to join the group or a broadcast (seconds).
GROUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class MasterMetadata:
    """Where the group's store listens (actor rank 0)."""

    host: str
    port: int


def _host() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address()).strip("[]")
    except Exception:  # outside Ray (the tests): this host
        return socket.gethostbyname(socket.gethostname())


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Broadcast the weights from actor rank 0 to the rollout workers over gloo.

    Args:
        bucket_size: bytes per broadcast (VeRL's ``update_weights_bucket_megabytes``).
        is_master: actor rank 0 (VeRL passes it to the actor's engine only).

    """

    def __init__(self, bucket_size: int, is_master: bool = False, **_kwargs: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: dist.TCPStore | None = None
        self._group: Any = None

    def prepare(self) -> MasterMetadata | None:  # type: ignore[override]  # as nccl's
        """Actor rank 0 opens the store of this sync's group; returns where it listens."""
        if not self.is_master:
            return None
        host = _host()
        self._store = dist.TCPStore(
            host, 0, None, True, timedelta(seconds=GROUP_TIMEOUT_S), wait_for_workers=False
        )
        return MasterMetadata(host=host, port=self._store.port)

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[Any]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Actor rank 0 is rank 0, the other actor workers sit out (-1), rollout workers 1…n."""
        master = metadata[0]
        if not isinstance(master, MasterMetadata):
            raise ValueError("gloo checkpoint engine: actor rank 0 must be the engine's master")
        world_size = 1 + rollout_world_size
        actor: dict[str, list[Any]] = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master_metadata": [master] * actor_wg_world_size,
        }
        rollout: dict[str, list[Any]] = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master_metadata": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(  # type: ignore[override]  # VeRL passes build_topology's keys
        self, rank: int, world_size: int, master_metadata: MasterMetadata, **_kwargs: Any
    ) -> None:
        """Join this sync's gloo group (blocks until every rank has joined)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        timeout = timedelta(seconds=GROUP_TIMEOUT_S)
        store = self._store
        if store is None:
            store = dist.TCPStore(master_metadata.host, master_metadata.port, None, False, timeout)
            self._store = store
        self._group = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def finalize(self) -> None:
        """Drop the group and its store (a new one is built for every sync)."""
        self._group = None
        self._store = None
        self.rank = self.world_size = None

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._group.broadcast([tensor], dist.BroadcastOptions()).wait()

    def _send(self, payload: dict[str, Any], bucket: torch.Tensor) -> None:
        meta = torch.frombuffer(bytearray(pickle.dumps(payload)), dtype=torch.uint8)
        self._broadcast(torch.tensor([meta.numel()], dtype=torch.int64))
        self._broadcast(meta)
        self._broadcast(bucket)

    def _receive(self) -> tuple[dict[str, Any], torch.Tensor]:
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        meta = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(meta)
        payload = pickle.loads(meta.numpy().tobytes())  # written by rank 0 of this group
        bucket = torch.empty(payload["length"], dtype=torch.uint8)
        self._broadcast(bucket)
        return payload, bucket

    @torch.no_grad()
    async def send_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
    ) -> None:
        """Actor side: bucket the weights and broadcast each bucket with its metadata."""
        if self.rank is None or self.rank < 0:
            for _ in weights:  # producing each weight is collective over the actor group
                pass
            return
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        metas: dict[str, TensorMeta] = {}
        offset = 0
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + meta.chunk_size > self.bucket_size:
                payload = {"bucket_meta": metas, "is_last": False, "length": offset}
                await asyncio.to_thread(self._send, payload, bucket[:offset].clone())
                metas, offset = {}, 0
            meta.offset = offset
            metas[meta.name] = meta
            assert chunk is not None  # split_weight_chunks yields data unless meta_only
            bucket[offset : offset + meta.chunk_size] = chunk.cpu()
            offset += meta.chunk_size
        payload = {"bucket_meta": metas, "is_last": True, "length": offset}
        await asyncio.to_thread(self._send, payload, bucket[:offset].clone())

    async def _chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        while True:
            payload, bucket = await asyncio.to_thread(self._receive)
            for meta in payload["bucket_meta"].values():
                yield meta, bucket[meta.offset : meta.offset + meta.chunk_size]
            if payload["is_last"]:
                return

    @torch.no_grad()
    async def receive_weights(  # type: ignore[override]  # an async generator, as nccl's
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Rollout side: the weights, as ``(name, tensor)``, as the buckets arrive."""
        chunks: Any = self._chunks()  # VeRL annotates a Generator, iterates it with `async for`
        async for name, weight in merge_weight_chunks(chunks, self.bucket_size):
            yield name, weight
