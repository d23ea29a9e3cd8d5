"""An AXI4 slave DRAM model for Amaranth's simulator (docs/hardware.md, "DRAM model").

One :class:`AxiDram` is one DRAM: a flat byte array from address 0 behind any
number of AXI4 ports that share one DDR bandwidth budget. It is the
cycle-level image of the simulator's DRAM model (``sim/dram.py``): a transfer
alone takes exactly the cycles of docs/timing.md, and under contention the
ports share ``ddr_bytes_per_cycle`` round-robin.

Usage::

    sim = Simulator(top)
    sim.add_clock(1e-8)
    dram = AxiDram(config, 1 << 16)                # or an existing uint8 array
    dram.mem[:4] = (1, 2, 3, 4)
    dram.attach(sim, {0: top.load_axi, 1: top.store_axi})
    ...
    sim.run()
    dram.mem                                       # the final contents

Each port is an interface object whose attributes are the AXI members of
:func:`hw.ports.axi_signature` seen from the master (``arvalid``, ``rready``,
...); the model drives the members the master reads (``arready``, ``rvalid``,
``rdata``, ...). A port may have only read channels, only write channels, or
both.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tessera.config import HwConfig
from tessera.regmap import AXI_BOUNDARY_BYTES

from ..ports import AXI_BURST_INCR, AXI_RESP_OKAY

#: AXI response "slave error": the model's answer for bytes outside the array.
AXI_RESP_SLVERR = 2

_READ_OUT = ("arvalid", "araddr", "arlen", "arsize", "arburst", "arid", "rready")
_WRITE_OUT = ("awvalid", "awaddr", "awlen", "awsize", "awburst", "awid",
              "wvalid", "wdata", "wstrb", "wlast", "bready")


def _output_names(p: _Port) -> tuple[str, ...]:
    return (_READ_OUT if p.reads else ()) + (_WRITE_OUT if p.writes else ())


def _handshake_names(p: _Port) -> tuple[str, ...]:
    return ((("arvalid", "rready") if p.reads else ())
            + (("awvalid", "wvalid", "bready") if p.writes else ()))


class AxiProtocolError(Exception):
    """A master broke a rule the model relies on (burst size/type, a 4 KiB crossing, wlast)."""


class AxiEvent(NamedTuple):
    """One address handshake or write response, as recorded in :attr:`AxiDram.log`.

    ``kind`` is ``"AR"``, ``"AW"`` or ``"B"``; ``addr`` and ``beats`` describe
    the burst (for ``"B"``, the burst answered); ``resp`` is the response of a
    ``"B"`` (``None`` for address events).
    """

    cycle: int
    port: int
    kind: str
    addr: int
    beats: int
    id: int
    resp: int | None = None


@dataclass
class _ReadBurst:
    addr: int             # bus-aligned address of the first beat
    beats: int
    id: int
    ready_time: int
    next_beat: int = 0


@dataclass
class _WriteBurst:
    addr: int
    beats: int
    id: int
    aw_cycle: int
    done: int = 0         # beats written so far
    error: bool = False


@dataclass
class _Port:
    index: int
    iface: object
    reads: bool
    writes: bool
    reads_q: deque = field(default_factory=deque)     # _ReadBurst, oldest first
    offer: tuple | None = None                        # (data, resp, last, id) on the R channel
    writes_q: deque = field(default_factory=deque)    # _WriteBurst with beats outstanding
    early_w: deque = field(default_factory=deque)     # (data, strb, last, cycle) before their AW
    responses: deque = field(default_factory=deque)   # (due, id, resp, burst addr, beats)
    driven: dict = field(default_factory=dict)        # last value set on each model output


class AxiDram:
    """A byte-addressed DRAM behind AXI4 slave ports, for Amaranth simulation.

    ``config`` gives ``bus_bytes`` (B), ``dram_latency`` (L) and
    ``ddr_bytes_per_cycle`` (D); ``latency`` and ``ddr_bytes_per_cycle``
    override the last two. ``size_or_array`` is the size in bytes of a zeroed
    array, or a 1-D uint8 array used as the memory itself (not copied).

    Attributes after or during a run: :attr:`mem` (the contents),
    :attr:`cycle` (clock edges simulated so far), :attr:`log` (every AR, AW
    and B handshake as an :class:`AxiEvent`), :attr:`read_beats` /
    :attr:`write_beats` (per port, beats transferred). Cycles are numbered
    from 0 at the start of the simulation, so a testbench that counts its
    own ``ctx.tick()`` s shares the numbering of :attr:`log` (read its own
    count rather than :attr:`cycle`, which other testbenches may see before
    or after the model's update within a cycle).

    The model follows docs/hardware.md: in each cycle it reads the masters'
    outputs, grants DDR bandwidth round-robin over ports (a read beat before a
    write beat within a port), drives its outputs, and applies the
    handshakes that happen at the clock edge. A read beat with bytes outside
    the array returns zeros for them, with SLVERR; strobed bytes written
    outside the array are dropped and the burst is answered with SLVERR. Bursts must be INCR of ``B``-byte beats and must not
    cross a 4 KiB boundary (:class:`AxiProtocolError` otherwise, raised out of
    ``Simulator.run``). With ``check_comb`` the model also raises if a
    master's ``valid``/``ready`` output changes between the start of a cycle
    and its clock edge, i.e. if it depends combinationally on the model's
    outputs (or on anything else driven during the cycle).
    """

    def __init__(self, config: HwConfig, size_or_array: int | np.ndarray, *,
                 latency: int | None = None, ddr_bytes_per_cycle: float | None = None,
                 check_comb: bool = False) -> None:
        self.config = config
        self.bus_bytes = config.bus_bytes
        self.latency = config.dram_latency if latency is None else latency
        self.ddr_bytes_per_cycle = (config.ddr_bytes_per_cycle if ddr_bytes_per_cycle is None
                                    else ddr_bytes_per_cycle)
        if isinstance(size_or_array, (int, np.integer)):
            self.mem = np.zeros(int(size_or_array), dtype=np.uint8)
        else:
            mem = size_or_array
            if not isinstance(mem, np.ndarray) or mem.dtype != np.uint8 or mem.ndim != 1:
                raise TypeError("AxiDram needs a size in bytes or a 1-D uint8 numpy array")
            self.mem = mem
        self.cycle = 0
        self.log: list[AxiEvent] = []
        self.read_beats: dict[int, int] = {}
        self.write_beats: dict[int, int] = {}
        self._ports: list[_Port] = []
        self._budget = 0.0
        self._last_granted: int | None = None
        self._attached = False
        self._check_comb = check_comb

    # ------------------------------------------------------------------ API
    def attach(self, sim, ports: dict, *, domain: str = "sync") -> None:
        """Serve ``ports`` (DRAM port index -> AXI interface object) in simulator ``sim``.

        Adds one background testbench clocked by ``domain``; call it once per
        model, with every port that shares this DRAM's bandwidth. The port
        index orders the round-robin and names the port in :attr:`log`.
        """
        if self._attached:
            raise RuntimeError("an AxiDram serves one simulator; pass all its ports in one attach()")
        self._attached = True
        for index in sorted(ports):
            iface = ports[index]
            reads, writes = hasattr(iface, "arvalid"), hasattr(iface, "awvalid")
            if not (reads or writes):
                raise TypeError(f"port {index} has neither AXI read nor write channels")
            data_bits = len(iface.rdata if reads else iface.wdata)
            if data_bits != 8 * self.bus_bytes:
                raise ValueError(f"port {index} is {data_bits} bits wide, the DRAM bus "
                                 f"{8 * self.bus_bytes}")
            self._ports.append(_Port(index, iface, reads, writes))
            self.read_beats[index] = 0
            self.write_beats[index] = 0
        sim.add_testbench(self._make_testbench(domain), background=True)

    def read(self, addr: int, size: int) -> bytes:
        """``size`` bytes from ``addr`` (for test set-up and checks)."""
        return self.mem[addr:addr + size].tobytes()

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        """Store ``data`` at ``addr`` (for test set-up)."""
        data = np.frombuffer(bytes(data), dtype=np.uint8)
        self.mem[addr:addr + data.size] = data

    # ------------------------------------------------------------ the model
    def _make_testbench(self, domain: str):
        async def testbench(ctx):
            outputs = []
            for p in self._ports:
                outputs.extend(getattr(p.iface, n) for n in _output_names(p))
                if p.reads:
                    self._drive(ctx, p, "arready", 1)
                if p.writes:
                    self._drive(ctx, p, "awready", 1)
            while True:
                wvalid = {p.index: p.writes and ctx.get(p.iface.wvalid) for p in self._ports}
                early = {p.index: {n: ctx.get(getattr(p.iface, n)) for n in _handshake_names(p)}
                         for p in self._ports} if self._check_comb else None
                wgrant = self._grant(wvalid)
                for p in self._ports:
                    self._drive_outputs(ctx, p, wgrant[p.index])
                # Handshakes are judged on the values at the edge itself.
                _, _, *values = await ctx.tick(domain).sample(*outputs)
                pos = 0
                for p in self._ports:
                    names = _output_names(p)
                    sampled = dict(zip(names, values[pos:pos + len(names)]))
                    pos += len(names)
                    if early is not None:
                        self._check_stable(p, early[p.index], sampled)
                    self._edge(p, sampled, wgrant[p.index])
                self.cycle += 1
        return testbench

    def _check_stable(self, p: _Port, early: dict, sampled: dict) -> None:
        changed = [n for n, v in early.items() if sampled[n] != v]
        if changed:
            raise AxiProtocolError(
                f"port {p.index}: {', '.join(changed)} changed during cycle {self.cycle} after "
                "the DRAM drove its outputs (a combinational path from rvalid/wready/bvalid?)")

    def _grant(self, wvalid: dict[int, bool]) -> dict[int, bool]:
        """Step 2: share this cycle's DDR budget among the read and write candidates."""
        b = self.bus_bytes
        self._budget = min(self._budget, b) + self.ddr_bytes_per_cycle
        order = self._ports
        if self._last_granted is not None:
            k = next(i for i, p in enumerate(order) if p.index == self._last_granted) + 1
            order = order[k:] + order[:k]
        wgrant = {p.index: False for p in self._ports}
        for p in order:
            head = p.reads_q[0] if p.reads_q else None
            if head is not None and p.offer is None and self.cycle >= head.ready_time \
                    and self._budget >= b:
                self._budget -= b
                self._last_granted = p.index
                p.offer = self._beat(head)
                head.next_beat += 1
                if head.next_beat == head.beats:
                    p.reads_q.popleft()
            if wvalid[p.index] and self._budget >= b:
                self._budget -= b
                self._last_granted = p.index
                wgrant[p.index] = True
        return wgrant

    def _beat(self, burst: _ReadBurst) -> tuple:
        b = self.bus_bytes
        addr = burst.addr + burst.next_beat * b
        lo, hi = min(addr, self.mem.size), min(addr + b, self.mem.size)
        data = self.mem[lo:hi].tobytes()
        resp = AXI_RESP_OKAY if hi - lo == b else AXI_RESP_SLVERR
        data += bytes(b - len(data))
        last = burst.next_beat == burst.beats - 1
        return int.from_bytes(data, "little"), resp, last, burst.id

    def _drive(self, ctx, p: _Port, name: str, value: int) -> None:
        if p.driven.get(name) != value:
            ctx.set(getattr(p.iface, name), value)
            p.driven[name] = value

    def _drive_outputs(self, ctx, p: _Port, wgrant: bool) -> None:
        """Step 3: this cycle's R, W-ready and B outputs of one port."""
        if p.reads:
            if p.offer is None:
                self._drive(ctx, p, "rvalid", 0)
            else:
                data, resp, last, rid = p.offer
                self._drive(ctx, p, "rvalid", 1)
                self._drive(ctx, p, "rdata", data)
                self._drive(ctx, p, "rresp", resp)
                self._drive(ctx, p, "rlast", int(last))
                self._drive(ctx, p, "rid", rid)
        if p.writes:
            self._drive(ctx, p, "wready", int(wgrant))
            due = p.responses and p.responses[0][0] <= self.cycle
            self._drive(ctx, p, "bvalid", int(bool(due)))
            if due:
                _, bid, resp, _, _ = p.responses[0]
                self._drive(ctx, p, "bid", bid)
                self._drive(ctx, p, "bresp", resp)

    def _edge(self, p: _Port, s: dict, wgrant: bool) -> None:
        """Step 4: the handshakes of one port at the clock edge ending this cycle."""
        c = self.cycle
        if p.reads:
            if s["arvalid"]:
                addr, beats = self._check_burst(p, "AR", s["araddr"], s["arlen"], s["arsize"],
                                                s["arburst"])
                p.reads_q.append(_ReadBurst(addr, beats, s["arid"], c + self.latency))
                self.log.append(AxiEvent(c, p.index, "AR", addr, beats, s["arid"]))
            if p.offer is not None and s["rready"]:
                p.offer = None
                self.read_beats[p.index] += 1
        if p.writes:
            if p.responses and p.responses[0][0] <= c and s["bready"]:
                _, bid, resp, addr, beats = p.responses.popleft()
                self.log.append(AxiEvent(c, p.index, "B", addr, beats, bid, resp))
            if s["awvalid"]:
                addr, beats = self._check_burst(p, "AW", s["awaddr"], s["awlen"], s["awsize"],
                                                s["awburst"])
                p.writes_q.append(_WriteBurst(addr, beats, s["awid"], c))
                self.log.append(AxiEvent(c, p.index, "AW", addr, beats, s["awid"]))
                while p.early_w and p.writes_q:
                    self._write_beat(p, *p.early_w.popleft())
            if s["wvalid"] and wgrant:
                self.write_beats[p.index] += 1
                if p.writes_q:
                    self._write_beat(p, s["wdata"], s["wstrb"], s["wlast"], c)
                else:
                    p.early_w.append((s["wdata"], s["wstrb"], s["wlast"], c))

    def _write_beat(self, p: _Port, data: int, strb: int, last: int, cycle: int) -> None:
        b = self.bus_bytes
        burst = p.writes_q[0]
        addr = burst.addr + burst.done * b
        raw = data.to_bytes(b, "little")
        for lane in range(b):
            if strb >> lane & 1:
                if addr + lane < self.mem.size:
                    self.mem[addr + lane] = raw[lane]
                else:
                    burst.error = True
        burst.done += 1
        if bool(last) != (burst.done == burst.beats):
            raise AxiProtocolError(
                f"port {p.index}: wlast={int(bool(last))} on beat {burst.done} of a "
                f"{burst.beats}-beat burst at {burst.addr:#x} (cycle {cycle})")
        if burst.done == burst.beats:
            p.writes_q.popleft()
            p.responses.append((max(cycle, burst.aw_cycle) + self.latency, burst.id,
                                AXI_RESP_SLVERR if burst.error else AXI_RESP_OKAY,
                                burst.addr, burst.beats))

    def _check_burst(self, p: _Port, kind: str, addr: int, alen: int, size: int,
                     burst: int) -> tuple[int, int]:
        b = self.bus_bytes
        beats = alen + 1
        if 1 << size != b or burst != AXI_BURST_INCR:
            raise AxiProtocolError(f"port {p.index}: {kind} at {addr:#x} has size {1 << size} B "
                                   f"and burst type {burst}; the model takes INCR bursts of "
                                   f"{b}-byte beats (cycle {self.cycle})")
        aligned = addr - addr % b
        if aligned // AXI_BOUNDARY_BYTES != (aligned + beats * b - 1) // AXI_BOUNDARY_BYTES:
            raise AxiProtocolError(f"port {p.index}: {kind} burst of {beats} beats at {addr:#x} "
                                   f"crosses a {AXI_BOUNDARY_BYTES}-byte boundary "
                                   f"(cycle {self.cycle})")
        return aligned, beats
