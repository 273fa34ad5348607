"""The collectives shardflow's own rank code calls, each on the process group's device.

NCCL only takes tensors on the rank's GPU (a CPU tensor fails with "No backend type associated
with device type cpu"), and its barrier needs the rank's device; gloo takes CPU tensors. Every
reduction, gather and barrier of the training, measuring and checkpoint paths goes through
``Group``, which moves values to the device the backend serves and hands results back on the CPU.
``tests/rec/test_collectives.py`` keeps ``torch.distributed``'s collectives out of every other
module, since CI has no GPU to catch a tensor on the wrong device.

The process group itself is joined here too (``join``): on cuda the rank's GPU is made current
first, as object collectives (DCP's checkpoint coordination) use the current device.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rec.sharding import ComputeDevice
from rec.train.config import COLLECTIVE_TIMEOUT_S

BACKENDS = {ComputeDevice.CUDA: "nccl", ComputeDevice.CPU: "gloo"}


def rank_device(compute_device: ComputeDevice | str) -> torch.device:
    """This rank's device: its GPU (``LOCAL_RANK``, torchrun's) on cuda, else the CPU."""
    if ComputeDevice(compute_device) is ComputeDevice.CUDA:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


# How long a rank waits in a collective for the others, unless --collective-timeout says: NCCL's default,
# for gloo too (its own is 30 minutes: a frozen peer, a node stopped by SIGSTOP, held every node that
# long, its progress frozen).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)


def join(compute_device: ComputeDevice | str, store: dist.Store, rank: int, world_size: int,
         timeout: datetime.timedelta | None = None) -> Group:
    """Join the default process group of ``compute_device``'s ranks (NCCL on cuda, gloo on cpu), whose
    collectives wait ``timeout`` (``COLLECTIVE_TIMEOUT``) for the others."""
    device = rank_device(compute_device)
    backend = BACKENDS[ComputeDevice(compute_device)]
    waits = timeout or COLLECTIVE_TIMEOUT
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, device_id=device,
                                timeout=waits)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=waits)
    return Group(device)


@dataclass(frozen=True)
class Group:
    """The default process group as this rank uses it: ``device`` is where its collectives' tensors live."""

    device: torch.device

    @classmethod
    def current(cls) -> Group:
        """The default process group (joined): NCCL's tensors on this rank's current GPU."""
        if dist.get_backend() == "nccl":
            return cls(torch.device("cuda", torch.cuda.current_device()))
        return cls(torch.device("cpu"))

    def _on_device(self, values: torch.Tensor | Sequence[float]) -> torch.Tensor:
        if isinstance(values, torch.Tensor):
            return values.detach().to(self.device, torch.float64)
        return torch.tensor(list(values), dtype=torch.float64, device=self.device)

    def all_reduce(self, values: torch.Tensor | Sequence[float], op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        """``values`` reduced over the ranks (float64, on the CPU)."""
        tensor = self._on_device(values)
        if tensor.numel():  # empty on every rank alike (a resume at the last iteration): NCCL is not asked for 0 bytes
            dist.all_reduce(tensor, op=op)
        return tensor.cpu()

    def max(self, values: torch.Tensor | Sequence[float]) -> torch.Tensor:
        return self.all_reduce(values, dist.ReduceOp.MAX)

    def sum(self, values: torch.Tensor | Sequence[float]) -> torch.Tensor:
        return self.all_reduce(values, dist.ReduceOp.SUM)

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any."""
        return bool(self.max([1.0 if flag else 0.0])[0] > 0)

    def all_gather(self, values: torch.Tensor | Sequence[float]) -> list[torch.Tensor]:
        """Every rank's ``values`` (the same length on each), in rank order, on the CPU."""
        tensor = self._on_device(values)
        if not tensor.numel():  # empty on every rank alike: nothing to send (NCCL is not asked for 0 bytes)
            return [tensor.cpu() for _ in range(dist.get_world_size())]
        every = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(every, tensor)
        return [t.cpu() for t in every]

    def gather_rows(self, rows: torch.Tensor, chunk: int = 1 << 20) -> list[torch.Tensor] | None:
        """Every rank's ``rows`` (float64 ``(k, n_rank)``; ``n_rank`` may differ) on rank 0, in rank
        order; None on the others. Sent ``chunk`` columns a round, so that the device holds at most
        ``world x chunk`` columns, whatever the total."""
        rows = rows.to(torch.float64)
        rank, world = dist.get_rank(), dist.get_world_size()
        lengths = [int(t[0]) for t in self.all_gather([float(rows.shape[1])])]
        pieces: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for start in range(0, max(lengths), chunk):
            width = min(chunk, max(lengths) - start)
            send = torch.zeros((rows.shape[0], width), dtype=torch.float64, device=self.device)
            mine = rows[:, start:start + width]
            send[:, :mine.shape[1]] = mine.to(self.device)
            every = [torch.empty_like(send) for _ in range(world)] if rank == 0 else None
            dist.gather(send, every, dst=0)
            if every is not None:
                for r, t in enumerate(every):
                    pieces[r].append(t[:, :max(0, min(width, lengths[r] - start))].cpu())
        if rank != 0:
            return None
        return [torch.cat(p, dim=1) if p else rows.new_zeros((rows.shape[0], 0)) for p in pieces]

    def first_text(self, text: str | None) -> str | None:
        """The ``text`` of the lowest rank that has one, on every rank; None on every rank when none
        has. Every rank calls it, text or not: how ranks agree on a failure some of them met alone."""
        world = dist.get_world_size()
        first = int(self.all_reduce([float(world if text is None else dist.get_rank())], dist.ReduceOp.MIN)[0])
        if first == world:
            return None
        return self.broadcast_bytes((text or "").encode(), src=first).decode(errors="replace")

    def broadcast_bytes(self, data: bytes, group: dist.ProcessGroup | None = None, src: int = 0) -> bytes:
        """``data`` of ``group``'s rank ``src`` (default: its first; the default group's ranks are the
        global ones) on every rank of ``group``; the other ranks' ``data`` is ignored. Sent as tensors
        on ``device``: nothing is unpickled."""
        src = src if group is None else dist.get_global_rank(group, src)
        mine = dist.get_rank() == src
        size = torch.tensor([len(data) if mine else 0], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src, group=group)
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        if mine and data:
            payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(payload, src, group=group)
        return payload.cpu().numpy().tobytes()

    def barrier(self) -> None:
        """Every rank waits here for the others (NCCL's on this rank's GPU)."""
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index if self.device.index is not None else 0])
        else:
            dist.barrier()
