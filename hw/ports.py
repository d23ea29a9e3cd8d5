"""Interface signatures shared by the hardware modules: AXI4, AXI4-Lite, SRAM ports.

All signatures are written from the initiator's side (``Out`` = driven by the
AXI master or by the module that owns the address); a target flips them.
Member names are the AXI signal names, so the exported top level can expose
them as ``m_axi_p0_araddr`` etc., which Vivado's IP integrator recognises.
Widths come from :mod:`tessera.regmap`.
"""
from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tessera.regmap import (AXI_ADDR_BITS, AXI_ID_BITS, AXI_LEN_BITS, CTRL_ADDR_BITS,
                            CTRL_DATA_BITS)

#: AXI burst type INCR and response OKAY.
AXI_BURST_INCR = 1
AXI_RESP_OKAY = 0


def axi_read_members(data_bits: int) -> dict:
    return {
        "arvalid": Out(1), "arready": In(1), "araddr": Out(AXI_ADDR_BITS),
        "arlen": Out(AXI_LEN_BITS), "arsize": Out(3), "arburst": Out(2), "arid": Out(AXI_ID_BITS),
        "rvalid": In(1), "rready": Out(1), "rdata": In(data_bits), "rresp": In(2),
        "rlast": In(1), "rid": In(AXI_ID_BITS),
    }


def axi_write_members(data_bits: int) -> dict:
    return {
        "awvalid": Out(1), "awready": In(1), "awaddr": Out(AXI_ADDR_BITS),
        "awlen": Out(AXI_LEN_BITS), "awsize": Out(3), "awburst": Out(2), "awid": Out(AXI_ID_BITS),
        "wvalid": Out(1), "wready": In(1), "wdata": Out(data_bits), "wstrb": Out(data_bits // 8),
        "wlast": Out(1),
        "bvalid": In(1), "bready": Out(1), "bresp": In(2), "bid": In(AXI_ID_BITS),
    }


def axi_signature(data_bits: int, *, read: bool = True, write: bool = True) -> wiring.Signature:
    """An AXI4 master interface with the read and/or write channels."""
    members: dict = {}
    if read:
        members.update(axi_read_members(data_bits))
    if write:
        members.update(axi_write_members(data_bits))
    return wiring.Signature(members)


def axi_lite_signature() -> wiring.Signature:
    """An AXI4-Lite master interface (the accelerator's control slave flips it)."""
    return wiring.Signature({
        "awvalid": Out(1), "awready": In(1), "awaddr": Out(CTRL_ADDR_BITS),
        "wvalid": Out(1), "wready": In(1), "wdata": Out(CTRL_DATA_BITS),
        "wstrb": Out(CTRL_DATA_BITS // 8),
        "bvalid": In(1), "bready": Out(1), "bresp": In(2),
        "arvalid": Out(1), "arready": In(1), "araddr": Out(CTRL_ADDR_BITS),
        "rvalid": In(1), "rready": Out(1), "rdata": In(CTRL_DATA_BITS), "rresp": In(2),
    })


def sram_write_signature(addr_bits: int, data_bits: int) -> wiring.Signature:
    """A synchronous SRAM write port: ``data`` lands at ``addr`` at the clock edge when ``en``."""
    return wiring.Signature({"addr": Out(addr_bits), "data": Out(data_bits), "en": Out(1)})


def sram_read_signature(addr_bits: int, data_bits: int) -> wiring.Signature:
    """A synchronous SRAM read port: ``data`` holds the entry at ``addr`` one cycle after a
    cycle with ``en`` set, and keeps it while ``en`` is low."""
    return wiring.Signature({"addr": Out(addr_bits), "en": Out(1), "data": In(data_bits)})
