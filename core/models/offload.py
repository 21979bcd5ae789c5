"""Activation checkpoints offloaded to pinned host memory (CUDA).

Under gradient checkpointing each block keeps only its input for the backward pass; at long
context those inputs (layers x tokens x width) are what is left on the card. Here every block's
input but the last's is copied to pinned host memory on a side stream while the forward goes
on, and fetched back on that stream one block ahead of the backward that needs it, so the
copies overlap compute and the card holds the last block's input, the one being recomputed and
the one on its way. The last block's input stays on the card: its backward comes first, with
no compute before it to hide a fetch behind.

torch.autograd.graph.save_on_cpu does not fit: it copies every saved tensor (a checkpointed
block saves none of its inputs through those hooks) on the compute stream, synchronously, with
no prefetch. On the CPU there is nothing to offload to, so the model uses plain checkpointing
there (`streams_for` answers None); the order of copies and waits is tested on the CPU with a
stand-in for the streams (tests/core/test_offload.py).
"""

from __future__ import annotations

import torch

from core.models.moe import is_sparse
from core.models.per_layer import kv_sources
from core.models.per_layer import of as per_layer_of


def offloads(c) -> bool:
    """Whether a model of shape c (a GPTConfig) offloads its checkpoints to pinned RAM where
    it trains on CUDA: under checkpointing with offload_checkpoints on, unless something
    crosses the blocks beside their inputs. An MoE's router loss reads its forward's routes,
    which the offloaded forward (run without gradients) would leave without any; Gemma 4's
    per-layer inputs and shared keys and values reach the blocks beside the stream, so their
    gradients would be lost: those keep plain checkpointing. The one answer the model, the
    memory estimate and the fit ladder all ask (tests/core/test_offload.py)."""
    if not (c.grad_checkpointing and c.offload_checkpoints):
        return False
    sparse = any(is_sparse(c, i) for i in range(c.n_layers))
    return not (sparse or per_layer_of(c).input_dim or kv_sources(c))


class CudaStreams:
    """The copies on a side CUDA stream, each followed by an event the compute stream waits
    for before it reads what was copied."""

    def __init__(self, device: torch.device):
        self.side = torch.cuda.Stream(device)

    def to_host(self, x: torch.Tensor):
        main = torch.cuda.current_stream(x.device)
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        with torch.cuda.stream(self.side):
            self.side.wait_stream(main)  # x is complete before it is read
            host.copy_(x, non_blocking=True)
        x.record_stream(self.side)  # its memory is not reused before the copy has read it
        return host

    def to_device(self, host: torch.Tensor, device: torch.device):
        with torch.cuda.stream(self.side):  # after the copy out: the same stream
            x = host.to(device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        return x, done

    def wait(self, done, x: torch.Tensor) -> None:
        main = torch.cuda.current_stream(x.device)
        main.wait_event(done)
        x.record_stream(main)  # made on the side stream, freed after the compute stream's use


_STREAMS: dict = {}  # one side stream a device, made on first use


def streams_for(device: torch.device) -> CudaStreams | None:
    """The streams that offload on this device; None on the CPU (a no-op by design)."""
    if device.type != "cuda":
        return None
    if device not in _STREAMS:
        _STREAMS[device] = CudaStreams(device)
    return _STREAMS[device]


class Offload:
    """One forward's block inputs: layer i's kept on the device (the last), on the host, or
    on its way back."""

    def __init__(self, streams, n_layers: int):
        self.streams, self.last = streams, n_layers - 1
        self.kept: dict[int, torch.Tensor] = {}
        self.host: dict[int, torch.Tensor] = {}
        self.coming: dict[int, tuple] = {}
        self.device = None

    def put(self, i: int, x: torch.Tensor) -> None:
        self.device = x.device
        if i == self.last:
            self.kept[i] = x
        else:
            self.host[i] = self.streams.to_host(x)

    def take(self, i: int) -> torch.Tensor:
        """Layer i's input on the device for its backward; the next one down starts coming
        back now, behind this block's recomputation and backward."""
        if i in self.kept:
            x = self.kept.pop(i)
        else:
            self._fetch(i)
            x, done = self.coming.pop(i)
            self.streams.wait(done, x)
        if i - 1 >= 0:
            self._fetch(i - 1)
        return x

    def _fetch(self, i: int) -> None:
        if i not in self.coming and i in self.host:
            self.coming[i] = self.streams.to_device(self.host.pop(i), self.device)


class _OffloadedBlock(torch.autograd.Function):
    """block(x) whose input waits on the host for the backward pass, which runs the block
    again (as reentrant checkpointing does: the parameters' gradients accumulate there)."""

    @staticmethod
    def forward(ctx, anchor, x, block, i: int, offload: Offload, extra: tuple):
        ctx.block, ctx.i, ctx.offload, ctx.extra = block, i, offload, extra
        ctx.rng = _rng_state(x.device)
        kind = x.device.type
        ctx.amp = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        offload.put(i, x.detach())
        with torch.no_grad():
            return block(x, *extra)

    @staticmethod
    def backward(ctx, grad):
        x = ctx.offload.take(ctx.i).detach().requires_grad_()
        kind, dtype, amp = ctx.amp
        with torch.random.fork_rng(devices=_rng_devices(x.device)), torch.enable_grad():
            _set_rng_state(x.device, ctx.rng)  # dropout draws what the forward drew
            with torch.autocast(kind, dtype=dtype, enabled=amp):  # as the forward ran
                y = ctx.block(x, *ctx.extra)
        torch.autograd.backward(y, grad)
        return None, x.grad, None, None, None, None


def run_blocks(blocks, x: torch.Tensor, extras: list[tuple], streams) -> torch.Tensor:
    """x through blocks, each checkpointed with its input offloaded through streams;
    extras[i]: block i's other arguments (rope, its mask)."""
    offload = Offload(streams, len(blocks))
    anchor = torch.empty(0, requires_grad=True)  # a frozen base's input needs no gradient
    for i, block in enumerate(blocks):
        x = _OffloadedBlock.apply(anchor, x, block, i, offload, extras[i])
    return x


def _rng_devices(device: torch.device) -> list:
    return [device] if device.type == "cuda" else []


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
