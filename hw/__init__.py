"""``tessera.hw``: the Amaranth accelerator (fetch, load, compute, store).

Built from :class:`tessera.config.HwConfig` and the layouts of
:mod:`tessera.isa`; the RTL arrives with the hardware issue.
"""
