"""The target's full KV cache with some layers' K/V in pinned CPU memory (the offload manager).

Same contract and the same numbers as `FullCache` (keys post-RoPE, [Hkv, capacity, D] per layer),
but a layer the plan offloads keeps its K/V in (pinned) CPU memory. During a forward each
offloaded layer's *filled prefix* (the `length` tokens held) is copied into one of two staging
buffers on its card, on a side CUDA stream, one layer ahead:

    side stream:    copy A->slot0  copy B->slot1 | wait(A done) writeback A, copy C->slot0 | ...
    compute stream: ...wait(copy A) attend A | record(A done) ...wait(copy B) attend B | ...

- the compute stream waits for a slot's copy event before attending on it;
- the copy of the offloaded layer two ahead into the same slot waits (on the side stream) for
  an event recorded after that slot's attention, so it never overwrites K/V still being read;
- the new tokens' K/V are written into the staging slot by the attention step and copied back
  to the pinned buffers asynchronously on the side stream (ordered after the compute); layer_kv
  waits for that layer's write-back before handing out CPU views, load_prefix drains all copies.
- after a forward the first two offloaded layers of each card are prefetched again, so the copy
  runs while the lower levels draft (the planner's `l2_prefetched_ms`); a slot that still holds
  a layer's prefix (e.g. only one or two layers offloaded) is not copied again.

Resident layers behave exactly like FullCache. Layers may live on different devices
(`layer_devices`, the runner's layer split): each card has its own side stream and its own two
staging buffers for its own offloaded layers. Without CUDA the same code runs with the CPU
standing in for both sides (plain synchronous copies into the staging buffers, no streams), so
the logic is tested on any machine.

Copies go per KV head: head h's first `length` rows are contiguous in a [Hkv, capacity, D]
buffer, so each copy is one contiguous block (a strided prefix of the whole layer is not, and
torch would stage it through pageable memory, synchronously).

Hybrid offload (`cpu_heads`): for a decode or verification forward (at most HYBRID_MAX_NEW new
tokens) an offloaded layer's first `cpu_heads[layer]` KV heads are attended on the CPU, where
their K/V live (engine/kv/cpu_attention.py): their new q/k/v go down, the output comes back.
Only the other heads are staged over PCIe. The streamed heads' attention is launched on the card
first, so the card and the side stream's copies run while the CPU attends. Prefill streams every
head (its attention is compute-heavy). The split is the planner's (sized so the CPU and the link
finish together).
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import torch

from engine.kv.attention import gqa_attention
from engine.kv.cpu_attention import cpu_gqa_attention
from engine.kv.full import FullCache
from engine.kv.base import KVCache
from engine.errors import InvalidSettingError
from engine.events import CacheStats
from engine.kv.rope import Rotary, rotate

STAGING_SLOTS = 2
HYBRID_MAX_NEW = 33  # decode and verification forwards (gamma2 + 1 <= 33); prefill chunks stream


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A CPU tensor, page-locked when `pin` (CUDA present). torch's pinned allocator rounds every
    block up to a power of two (a 2.1 GB layer would take 4.3 GB), so other sizes are allocated
    pageable and registered with cudaHostRegister instead."""
    t = torch.zeros(shape, dtype=dtype)
    if not pin:
        return t
    nbytes = t.numel() * t.element_size()
    if nbytes & (nbytes - 1) == 0:
        return torch.zeros(shape, dtype=dtype, pin_memory=True)
    try:
        cudart = torch.cuda.cudart()
        if int(cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)) != 0:
            raise RuntimeError("cudaHostRegister failed")
        weakref.finalize(t, cudart.cudaHostUnregister, t.data_ptr())
        return t
    except Exception:  # noqa: BLE001  fall back to torch's allocator (rounded up, but pinned)
        return torch.zeros(shape, dtype=dtype, pin_memory=True)


class _Lane:
    """One card's copy machinery: a side stream and per-slot events (CUDA); nothing on the CPU."""

    def __init__(self, device: torch.device, n_slots: int) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.ready = [torch.cuda.Event() if self.cuda else None for _ in range(n_slots)]  # copy into slot done
        self.freed = [torch.cuda.Event() if self.cuda else None for _ in range(n_slots)]  # attention on slot done

    def side(self):
        return torch.cuda.stream(self.stream) if self.cuda else _Null()

    def compute_waits_for_copy(self, slot: int) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])

    def side_waits_for_compute(self, slot: int) -> None:
        if self.cuda:
            self.freed[slot].record(torch.cuda.current_stream(self.device))
            self.stream.wait_event(self.freed[slot])

    def copied(self, slot: int) -> None:
        if self.cuda:
            self.ready[slot].record(self.stream)

    def drain(self) -> None:
        if self.cuda:
            self.stream.synchronize()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OffloadedCache(FullCache):
    """FullCache whose `offloaded` layers keep K/V in (pinned) CPU memory and stream their filled
    prefix into two staging buffers per card during each forward.

    layer_devices: the device each layer computes on (default: all on `device`); resident
    layers' buffers and each card's staging buffers live there.
    prefetch: False copies each offloaded layer only when it is reached (the serial, no-overlap
    variant gpu-check compares against). prefetch_between: restage the first offloaded layers
    right after a forward (while the lower levels draft).
    cpu_heads: KV heads of each offloaded layer attended on the CPU in decode/verification
    forwards (hybrid offload): an int for every offloaded layer, or {layer: heads}.
    """

    name = "full"

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str, offloaded: Sequence[int] = (), *,
                 layer_devices: Sequence[torch.device | str] | None = None, prefetch: bool = True,
                 prefetch_between: bool = True, cpu_heads: int | dict[int, int] | None = None) -> None:
        KVCache.__init__(self, capacity, dtype, torch.device(device))
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        devices = [torch.device(d) for d in layer_devices] if layer_devices else [self.device] * n_layers
        if len(devices) != n_layers:
            raise InvalidSettingError(f"layer_devices has {len(devices)} entries for {n_layers} layers")
        self.device = devices[0]
        self.layer_devices = devices
        self.offloaded = sorted(set(int(i) for i in offloaded))
        if any(not 0 <= i < n_layers for i in self.offloaded):
            raise InvalidSettingError(f"offloaded layers {self.offloaded} out of range 0..{n_layers - 1}")
        self.prefetch, self.prefetch_between = prefetch, prefetch_between
        off = set(self.offloaded)
        split = cpu_heads if isinstance(cpu_heads, dict) else {i: int(cpu_heads or 0) for i in off}
        if any(i not in off or not 0 <= c <= n_kv_heads for i, c in split.items()):
            raise InvalidSettingError(f"cpu_heads {split} must name offloaded layers and 0..{n_kv_heads} heads each")
        self.cpu_heads = {i: int(c) for i, c in split.items() if c}  # layer -> KV heads attended on the CPU
        self._hybrid = False  # the forward in progress splits heads (decode/verification)
        pin = torch.cuda.is_available() and any(devices[i].type == "cuda" for i in off)
        shape = (n_kv_heads, capacity, head_dim)
        self.keys, self.values = [], []
        for i in range(n_layers):
            if i in off:
                self.keys.append(pinned_empty(shape, dtype, pin))
                self.values.append(pinned_empty(shape, dtype, pin))
            else:
                self.keys.append(torch.zeros(shape, dtype=dtype, device=devices[i]))
                self.values.append(torch.zeros(shape, dtype=dtype, device=devices[i]))
        # per card: its offloaded layers in order, two staging slots, a lane (side stream + events)
        self._order: dict[torch.device, list[int]] = {}
        for i in self.offloaded:
            self._order.setdefault(devices[i], []).append(i)
        self._rank = {i: (d, j) for d, layers in self._order.items() for j, i in enumerate(layers)}
        self._lanes: dict[torch.device, _Lane] = {}
        self._stage_k: dict[torch.device, list[torch.Tensor]] = {}
        self._stage_v: dict[torch.device, list[torch.Tensor]] = {}
        self._staged: dict[torch.device, list[tuple[int, int, int] | None]] = {}  # slot -> (layer, prefix, first head)
        for d, layers in self._order.items():
            slots = min(STAGING_SLOTS, len(layers))
            self._lanes[d] = _Lane(d, slots)
            self._stage_k[d] = [torch.zeros(shape, dtype=dtype, device=d) for _ in range(slots)]
            self._stage_v[d] = [torch.zeros(shape, dtype=dtype, device=d) for _ in range(slots)]
            self._staged[d] = [None] * slots
        self.capture_query = False
        self.last_query: list[torch.Tensor | None] = [None] * n_layers
        self._written: dict[int, torch.cuda.Event] = {}  # layer -> its last write-back done (CUDA)
        self.copied_bytes = 0  # host-to-device bytes issued (tests and gpu-check count them)
        self.cpu_attended_bytes = 0  # K/V bytes the CPU attended where they live (hybrid)

    # --- copies --------------------------------------------------------------------------------
    def _first_streamed(self, layer: int) -> int:
        """The first KV head this forward streams for `layer` (heads before it are attended on the CPU)."""
        return self.cpu_heads.get(layer, 0) if self._hybrid else 0

    def _fetch(self, layer: int, upto: int, record: bool = True) -> None:
        """Stage layer's first `upto` tokens of its streamed heads into its slot (side stream),
        unless the slot holds them.

        The slot's ready event is recorded on the side stream after the copy, and so after the
        write-back of the slot's previous tokens: the compute stream waits on it before it writes
        or reads the slot. `record=False` (the check at attention time when prefetching) leaves
        the event alone when nothing is copied, so compute never waits for a later prefetch."""
        d, j = self._rank[layer]
        slot = j % len(self._staged[d])
        held = self._staged[d][slot]
        lane = self._lanes[d]
        first = self._first_streamed(layer)
        if held is not None and held[0] == layer and held[1] >= upto and held[2] <= first:
            if record:
                with lane.side():
                    lane.copied(slot)
            return
        dst_k, dst_v = self._stage_k[d][slot], self._stage_v[d][slot]
        src_k, src_v = self.keys[layer], self.values[layer]
        with lane.side():
            for h in range(first, self.n_kv_heads if upto else first):
                dst_k[h, :upto].copy_(src_k[h, :upto], non_blocking=True)
                dst_v[h, :upto].copy_(src_v[h, :upto], non_blocking=True)
            lane.copied(slot)
        self.copied_bytes += 2 * (self.n_kv_heads - first) * upto * self.head_dim * src_k.element_size()
        self._staged[d][slot] = (layer, upto, first)

    def _writeback(self, layer: int, slot: int, start: int, stop: int, first: int = 0) -> None:
        """New tokens' K/V of heads first.. from the staging slot to the CPU buffers, after the
        attention on the slot."""
        d = self._rank[layer][0]
        lane = self._lanes[d]
        lane.side_waits_for_compute(slot)
        src_k, src_v = self._stage_k[d][slot], self._stage_v[d][slot]
        with lane.side():
            for h in range(first, self.n_kv_heads):
                self.keys[layer][h, start:stop].copy_(src_k[h, start:stop], non_blocking=True)
                self.values[layer][h, start:stop].copy_(src_v[h, start:stop], non_blocking=True)
            if lane.cuda:
                self._written[layer] = torch.cuda.Event()
                self._written[layer].record(lane.stream)

    def _stage_first(self) -> None:
        for d, layers in self._order.items():
            for layer in layers[:len(self._staged[d])]:
                self._fetch(layer, self.length)

    def _drain(self) -> None:
        """Wait for every pending copy (before the host writes CPU buffers)."""
        for lane in self._lanes.values():
            lane.drain()
        self._written.clear()

    # --- the forward protocol ------------------------------------------------------------------
    def _prepare(self, positions: torch.Tensor, rope: Rotary) -> None:
        super()._prepare(positions, rope)
        self._hybrid = bool(self.cpu_heads) and self._new <= HYBRID_MAX_NEW
        if self.prefetch:
            self._stage_first()

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cos, sin, mask = self._tables_on(q.device)
        q = rotate(q, cos, sin)  # [Hq, T, D]
        k = rotate(k, cos, sin)  # [Hkv, T, D]
        start, stop = self.length, self.length + self._new
        if self.capture_query:
            self.last_query[layer] = q[:, -1].clone()  # [Hq, D]
        if layer not in self._rank:
            self.keys[layer][:, start:stop] = k
            self.values[layer][:, start:stop] = v
            return gqa_attention(q, self.keys[layer][:, :stop], self.values[layer][:, :stop], mask)
        d, j = self._rank[layer]
        slots = len(self._staged[d])
        slot = j % slots
        lane = self._lanes[d]
        first = self._first_streamed(layer)
        group = q.shape[0] // self.n_kv_heads
        on_cpu = None
        if first:  # hybrid: heads [0, first) are attended where their K/V live
            self._wait_written(layer)  # a pending write-back to these buffers must land first
            parts = (q[:first * group], k[:first], v[:first])  # [c*G, T, D], [c, T, D], [c, T, D]
            down = torch.cat([t.flatten() for t in parts]).to("cpu")  # one small copy to the host
            cq, ck, cv = down.split([t.numel() for t in parts])
            self.keys[layer][:first, start:stop] = ck.view_as(k[:first])
            self.values[layer][:first, start:stop] = cv.view_as(v[:first])
        out = None
        if first < self.n_kv_heads:
            self._fetch(layer, start, record=not self.prefetch)  # no-op when prefetched; the serial variant copies here
            lane.compute_waits_for_copy(slot)
            buf_k, buf_v = self._stage_k[d][slot], self._stage_v[d][slot]
            buf_k[first:, start:stop] = k[first:]
            buf_v[first:, start:stop] = v[first:]
            out = gqa_attention(q[first * group:], buf_k[first:, :stop], buf_v[first:, :stop], mask)  # launched, async
            self._staged[d][slot] = (layer, stop, first)
            self._writeback(layer, slot, start, stop, first)
        if first:  # the CPU attends while the card and the side stream work
            k_held, v_held = self.keys[layer][:first, :stop], self.values[layer][:first, :stop]  # [c, S, D]
            on_cpu = cpu_gqa_attention(cq.view(first * group, *q.shape[1:]), k_held, v_held)
            self.cpu_attended_bytes += 2 * k_held.numel() * k_held.element_size()
            on_cpu = on_cpu.to(q.device)
            out = on_cpu if out is None else torch.cat([on_cpu, out])  # [Hq, T, D], heads in order
        order = self._order[d]
        if self.prefetch and j + slots < len(order):
            self._fetch(order[j + slots], start)  # the layer that uses this slot next, one slot ahead
        return out

    def end(self) -> None:
        super().end()
        self._hybrid = bool(self.cpu_heads)  # the next forward is most likely a decode/verification
        if self.prefetch and self.prefetch_between:
            self._stage_first()

    def _wait_written(self, layer: int) -> None:
        """Block until this layer's last write-back to its CPU buffers has landed (CUDA)."""
        written = self._written.pop(layer, None)
        if written is not None:
            written.synchronize()

    # --- bookkeeping ---------------------------------------------------------------------------
    def layer_kv(self, layer: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [Hkv, stop-start, D]: on the layer's card if resident, CPU views if offloaded
        (callers copy what they need to their device). Waits only for this layer's last
        write-back, not for prefetches in flight."""
        self._wait_written(layer)
        return self.keys[layer][:, start:stop], self.values[layer][:, start:stop]

    def load_prefix(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        if layer in self._rank:
            self._drain()
            d, j = self._rank[layer]
            slot = j % len(self._staged[d])
            if self._staged[d][slot] is not None and self._staged[d][slot][0] == layer:
                self._staged[d][slot] = None
        n = keys.shape[1]
        self.keys[layer][:, :n] = keys.to(self.keys[layer].device, self.dtype)
        self.values[layer][:, :n] = values.to(self.values[layer].device, self.dtype)

    def staging_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in self._stage_k for t in self._stage_k[d] + self._stage_v[d])

    def stats(self) -> CacheStats:
        cards = []
        for d in self.layer_devices:
            if str(d) not in cards:
                cards.append(str(d))
        where = "+".join(cards + (["cpu"] if self.offloaded and "cpu" not in cards else []))
        detail = (f"{len(self.offloaded)} of {self.n_layers} layers offloaded to "
                  f"{'pinned ' if self.keys[self.offloaded[0]].is_pinned() else ''}CPU memory"
                  if self.offloaded else "all layers resident")
        if self.cpu_heads:
            detail += f"; hybrid: {sum(self.cpu_heads.values())} KV heads attended on the CPU"
        return CacheStats(self.name, self.length, self.capacity, self.nbytes_used(), self.nbytes_reserved(),
                          where, detail)


def offloaded_layers(plan) -> list[int]:
    """Layers whose full KV a planner `Plan` puts in pinned CPU memory (none on a CPU-only plan).
    Under tensor parallel every card offloads the same layers (its share of their KV heads)."""
    if plan.mode == "cpu":
        return []
    return [i for i, d in enumerate(plan.kv_devices) if d == "cpu"]


def hybrid_split(plan) -> dict[int, int]:
    """{layer: KV heads attended on the CPU} of a plan with hybrid offload (per card share under
    tensor parallel); {} when it streams every offloaded head or offloads nothing."""
    if getattr(plan, "offload_mode", "stream") != "hybrid":
        return {}
    return {i: c for i, c in enumerate(plan.cpu_heads) if c and plan.kv_devices[i] == "cpu"}


def cache_factory_for_plan(plan, **options) -> Callable:
    """`factory(runner, capacity) -> full cache` placing layers as `plan` says: its offloaded
    layers in pinned CPU memory (split with the CPU where the plan chose hybrid offload), every
    other layer on the card(s) the runner computes it on."""
    layers = offloaded_layers(plan)
    split = hybrid_split(plan) if layers else {}
    if split:
        options = {"cpu_heads": split, **options}

    def factory(runner, capacity: int):
        return runner.new_full_cache(capacity, layers, **options)

    return factory
