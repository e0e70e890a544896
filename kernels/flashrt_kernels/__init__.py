"""flashrt_kernels: fused Triton kernels of the flashrt engine, each beside its plain-PyTorch reference.

Every module opens with the formula it computes. `<name>(...)` launches the Triton kernel (GPU, Triton installed);
`<name>_reference(...)` is the PyTorch definition that the GPU tests compare against. Without Triton the
references still import; `HAVE_TRITON` says which case this is. `INTERPRETED`: Triton's CPU interpreter runs
the kernels (TRITON_INTERPRET=1), on CPU tensors. `HAVE_GLUON`: Triton's Gluon is importable
(kernels/flashrt_kernels/smem_gemm.py; kernels/flashrt_kernels/prefix_attention.py, the prefix attention on wgmma, whose reference is attention_reference).
kernels/flashrt_kernels/cuda/ holds CUDA C++ kernels, built by nvcc on first use (cuda_build.py;
`cuda_build_available()` says whether nvcc is here): StreamedGemmChain (streamed_gemm_chain.py) and its dependency
mechanism alone, HandoverChain (handover_chain.py).
Every launcher's `pdl` takes False, True or `EARLY_TRIGGER` (kernels/flashrt_kernels/_triton.py says what each means).
"""

from ._triton import EARLY_TRIGGER, HAVE_TRITON, INTERPRETED
from .ada_rms_norm import ada_rms_norm, ada_rms_norm_reference
from .attention import KEY_BLOCKS as ATTENTION_KEY_BLOCKS
from .attention import ROW_BLOCKS as ATTENTION_ROW_BLOCKS
from .attention import (attention, attention_reference, decoder_attention, decoder_attention_reference, merge_splits,
                        merge_splits_reference)
from .attention import split_launch as attention_split_launch
from .denoise_step import (denoise_step_in, denoise_step_in_reference, denoise_step_out,
                           denoise_step_out_reference, time_mlp_in, time_mlp_in_reference)
from .euler import euler, euler_reference
from .fp8_quant import fp8_quant, fp8_quant_reference
from .geglu import geglu, geglu_reference, swiglu, swiglu_reference
from .head_attention import head_attention, head_attention_reference
from .layer_chain import PERSISTENT_WAITS as LAYER_CHAIN_PERSISTENT_WAITS
from .layer_chain import WAITS as LAYER_CHAIN_WAITS
from .layer_chain import LayerChain, layer_chain, layer_chain_reference, resident_weights
from .partial_sums import MODES as PARTIAL_SUMS_MODES
from .partial_sums import PartialSums, partial_sums_reference
from .patch_embed import patch_rows, patch_rows_reference
from .prefix_attention import BLOCK_N as PREFIX_ATTENTION_BLOCK_N
from .prefix_attention import prefix_attention, prefix_attention_supported
from .qkv_gemm_rope import qkv_gemm_rope, qkv_gemm_rope_reference
from .qkv_rope import qkv_rope, qkv_rope_reference, qkv_rope_rows_per_program, rope_tables
from .residual_norm import residual_norm, residual_norm_reference
from .skinny_gemm import skinny_gemm, skinny_gemm_reference
from .smem_gemm import HAVE_GLUON, SMEM_GEMM_MAX_ROWS, smem_gemm, smem_gemm_supported
from .smem_gemm import X_ROWS as SMEM_GEMM_X_ROWS
from .cuda_build import cuda_build_available
from .handover_chain import HandoverChain
from .handover_chain import value as handover_chain_value
from .streamed_gemm_chain import LayerWeights as StreamedLayerWeights
from .streamed_gemm_chain import StreamedGemmChain, streamed_gemm_chain_reference
from .streamed_gemm_chain import pack_weight as pack_streamed_weight
from .streamed_gemm_chain import random_layer_weights as random_streamed_layer_weights

__all__ = [
    "EARLY_TRIGGER", "HAVE_TRITON", "INTERPRETED",
    "ada_rms_norm", "ada_rms_norm_reference",
    "attention", "attention_reference", "decoder_attention", "decoder_attention_reference",
    "merge_splits", "merge_splits_reference", "ATTENTION_KEY_BLOCKS", "ATTENTION_ROW_BLOCKS", "attention_split_launch",
    "denoise_step_in", "denoise_step_in_reference", "denoise_step_out", "denoise_step_out_reference",
    "time_mlp_in", "time_mlp_in_reference",
    "head_attention", "head_attention_reference",
    "euler", "euler_reference",
    "fp8_quant", "fp8_quant_reference",
    "geglu", "geglu_reference", "swiglu", "swiglu_reference",
    "LAYER_CHAIN_PERSISTENT_WAITS", "LAYER_CHAIN_WAITS",
    "LayerChain", "layer_chain", "layer_chain_reference", "resident_weights",
    "PARTIAL_SUMS_MODES", "PartialSums", "partial_sums_reference",
    "patch_rows", "patch_rows_reference",
    "PREFIX_ATTENTION_BLOCK_N", "prefix_attention", "prefix_attention_supported",
    "qkv_gemm_rope", "qkv_gemm_rope_reference",
    "qkv_rope", "qkv_rope_reference", "qkv_rope_rows_per_program", "rope_tables",
    "residual_norm", "residual_norm_reference",
    "skinny_gemm", "skinny_gemm_reference",
    "HAVE_GLUON", "SMEM_GEMM_MAX_ROWS", "SMEM_GEMM_X_ROWS", "smem_gemm", "smem_gemm_supported",
    "cuda_build_available", "StreamedLayerWeights", "StreamedGemmChain", "streamed_gemm_chain_reference",
    "pack_streamed_weight", "random_streamed_layer_weights", "HandoverChain", "handover_chain_value",
]
