"""``tessera.compiler``: operators in, accelerator programs out.

Build operators (:mod:`.accel.ops`), compile them with :func:`compile_ops` for any
:class:`~tessera.config.HwConfig`, run the result on the simulator::

    from tessera.compiler import Conv2d, compile_ops, requantize
    conv = Conv2d("c1", "x", "y", weight, stride=1, padding=1,
                  epilogue=requantize(scale, relu=True, bias=bias))
    compiled = compile_ops([conv], {"x": (1, 64, 56, 56)}, "pynq")
    outputs, result = compiled.run({"x": x})

The passes, each checked by a verifier in the tests: ``plan_conv_tiles`` /
``plan_alu_tiles`` (tiling, analytic legality, cost model),
``tensorize_conv2d`` / ``tensorize_pool2d`` / ``tensorize_eltwise``
(loop nests to GEMM/ALU instructions and uop kernels), ``plan_dram`` (tensor
placement with reuse), ``insert_dependency_tokens`` (hazard analysis of the
load/compute/store streams) and ``verify_program``. See docs/compiler.md.
"""
from .accel.acctile import AluPlan, plan_alu_tiles
from .accel.build import CompiledProgram, compile_op, compile_ops, infer_shapes
from .accel.conv import tensorize_conv2d
from .accel.convcost import estimate_conv_cycles, plan_conv_tiles
from .accel.convplan import ConvGeom, ConvPlan
from .accel.dram import DramPlan, plan_dram, verify_dram_plan
from .accel.eltwise import tensorize_eltwise
from .accel.epilogue import plan_epilogue
from tessera.errors import CompileError, VerificationError
from .accel.layout import (ActLayout, GroupBlocks, pack_activation, pack_conv_weights, pack_weights,
                     unpack_activation, unpack_conv_weights, unpack_weights)
from .accel.nest import map_nest
from .accel.ops import (AddConst, Apply, Bias, Clip, Conv2d, Dense, Eltwise, Pool2d, Requant,
                        Residual, Shift, clip, relu, requantize)
from .accel.packing import KernelPacking, choose_packing, pack_small_channel_convs
from .accel.patterns import Match, Pattern, PatternContext, match_node
from .accel.pool import tensorize_pool2d
from .accel.roofline import Roofline, conv_roofline
from .accel.sync import insert_dependency_tokens
from .accel.verify import VerifyReport, verify_program

__all__ = [
    "ActLayout", "AddConst", "AluPlan", "Apply", "Match", "Pattern", "PatternContext", "Bias", "Clip", "CompileError", "CompiledProgram",
    "Conv2d", "ConvGeom", "ConvPlan", "Dense", "DramPlan", "Eltwise", "GroupBlocks",
    "KernelPacking", "Pool2d", "Requant", "Residual", "Roofline", "Shift", "VerificationError",
    "VerifyReport", "choose_packing", "clip", "compile_op", "compile_ops", "conv_roofline",
    "estimate_conv_cycles", "infer_shapes", "insert_dependency_tokens",
    "map_nest", "match_node", "pack_activation", "pack_conv_weights", "pack_small_channel_convs",
    "pack_weights", "plan_alu_tiles", "plan_conv_tiles", "plan_dram", "plan_epilogue",
    "relu", "requantize", "tensorize_conv2d", "tensorize_eltwise", "tensorize_pool2d",
    "unpack_activation", "unpack_conv_weights", "unpack_weights", "verify_dram_plan",
    "verify_program",
]


def __getattr__(name: str):
    # The model zoo is public as ``tessera.compiler.zoo`` but needs onnx, which importing
    # ``tessera.compiler`` must not pull in: it loads on first use.
    if name == "zoo":
        from .frontend import zoo
        return zoo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
