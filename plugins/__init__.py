"""Intrinsic plug-ins shipped with Tessera.

Each is written against the public extension API only (``tessera.isa.register_alu_op``,
``tessera.hw.alu_ops.AluHardware``, ``tessera.compiler.accel.patterns.Pattern``), exactly
as a user's own package would be, and registered through the ``tessera.intrinsics``
entry-point group of Tessera's pyproject. Nothing in the other folders imports them.
"""
