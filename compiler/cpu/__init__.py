"""CPU fallback kernels for ops the accelerator cannot run, generated as LLVM IR
(llvmlite) per static shape, JIT-compiled for the host by ``tessera.runtime.jit`` and
run with ``tessera.runtime.cpu.load_kernel``.

Every builder returns a :class:`CpuKernel`; see :mod:`.kernel` for the calling
convention and :mod:`.irutil` for the IR helpers kernels are written with.
"""
from .conv import build_conv_int8, build_matmul_int8
from .conv_float import build_conv_float, build_conv_transpose_float
from .elementwise import E, fused_elementwise, maximum, minimum
from .gather import build_gather, build_gather_elements
from .kernel import DTYPES, CpuKernel, TensorSpec
from .lookup import build_byte_lookup
from .layout_ops import build_concat, build_pad, build_split, build_transpose
from .lrn import build_lrn
from .matmul import build_einsum, build_gemm, build_matmul, build_matmul_integer
from .norm import layer_norm
from .pool import (build_average_pool, build_global_average_pool, build_global_max_pool,
                   build_max_pool)
from .reduce import (REDUCE_OPS, arg_extreme, reduce_max, reduce_mean, reduce_min, reduce_sum,
                     reduction)
from .resize import build_resize
from .softmax import log_softmax, softmax
from .sparse import build_conv_nm, build_matmul_nm
from .sparse_layout import NMLayout, nm_layout
from .vector_width import host_vector_bits
from .sparse_pairs import PairLayout, build_matmul_nm_pairs, nm_pair_layout
from .strided import (build_depth_to_space, build_expand, build_slice, build_space_to_depth,
                      build_tile)

__all__ = [
    "DTYPES", "CpuKernel", "TensorSpec",
    # math kernels
    "E", "fused_elementwise", "maximum", "minimum",
    "REDUCE_OPS", "reduction", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
    "arg_extreme",
    "softmax", "log_softmax", "layer_norm", "build_lrn",
    # data-movement, pooling, resize, int8 conv / matmul kernels
    "build_concat", "build_pad", "build_split", "build_transpose", "build_slice",
    "build_expand", "build_tile", "build_depth_to_space", "build_space_to_depth",
    "build_gather", "build_gather_elements", "build_byte_lookup",
    "build_max_pool", "build_average_pool", "build_global_max_pool",
    "build_global_average_pool", "build_resize", "build_conv_int8", "build_matmul_int8",
    # float linear kernels
    "build_matmul", "build_matmul_integer", "build_gemm", "build_einsum", "build_conv_float",
    "build_conv_transpose_float",
    # N:M sparse kernels and their compressed weight layout
    "build_conv_nm", "build_matmul_nm", "NMLayout", "nm_layout", "host_vector_bits",
    "build_matmul_nm_pairs", "PairLayout", "nm_pair_layout",
]
