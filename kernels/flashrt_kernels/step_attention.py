"""A denoising step's attention as one CUDA C++ launch (cuda/step_attention.cu, built by nvcc: cuda_build.py).

The contract is decoder_attention's (kernels/flashrt_kernels/attention.py, decoder_attention_reference): the
step's queries and suffix keys with RoPE from the QKV GEMM's rows, the prefix keys from the KV cache, one KV head.
Where decoder_attention splits the keys over programs that store partial sums and merges them in a second launch,
this kernel splits each block of 16 query rows' keys over a cluster of 8 CTAs and merges their partial sums over
distributed shared memory: one launch, and the partial sums never leave the SMs. Each CTA copies its prefix keys'
K / V rows into shared memory before its PDL wait. Head dim 256 (Gemma's), at most MAX_KEYS keys (prefix + suffix).
"""

from __future__ import annotations

import ctypes
import functools

import torch

LIBRARY = "step_attention"
HEAD_DIM = 256
CLUSTER = 8          # CTAs per block of 16 query rows, each over an eighth of the keys


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The kernel's library (built by nvcc on first use), its C functions typed."""
    from .cuda_build import load_library
    lib = load_library(LIBRARY)
    lib.step_attention.argtypes = ([ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_longlong] + [ctypes.c_void_p] * 4 +
                                   [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                    ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p])
    lib.step_attention.restype = ctypes.c_int
    lib.step_attention_max_keys.restype = ctypes.c_int
    return lib


def max_keys() -> int:
    """The most keys (prefix + suffix) one launch serves."""
    return int(library().step_attention_max_keys())


def step_attention_supported(tokens: int, prefix_len: int, head_dim: int, device: torch.device) -> bool:
    """Whether this kernel serves the shape here: a Hopper-or-newer GPU (clusters, griddepcontrol), nvcc to build
    it, head dim 256 and prefix_len + tokens within max_keys()."""
    from .cuda_build import cuda_build_available
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9 or not cuda_build_available():
        return False
    return head_dim == HEAD_DIM and tokens >= 1 and 1 <= prefix_len and prefix_len + tokens <= max_keys()


def cluster_step_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                           cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, prefix_len: int,
                           visible: torch.Tensor, heads: int, q_scale: float, out: torch.Tensor,
                           pdl: bool | int = False) -> torch.Tensor:
    """decoder_attention_reference's contract written into out (tokens * heads, 256) bf16, on the current stream
    (so into a CUDA graph being captured). qkv (tokens, (heads + 2) * 256) bf16, caches (>= prefix_len, 256) bf16
    with contiguous rows, pos (tokens,) int64, visible (tokens,) int32, cos / sin (positions, 128) fp32, bias
    (>= prefix_len,) fp32, the tables' rows 16-byte aligned. pdl: False, True or EARLY_TRIGGER as for every launcher
    (kernels/flashrt_kernels/_triton.py): a programmatic dependent launch starts copying its prefix K / V before the
    kernel ahead, which writes qkv, has finished."""
    tokens = qkv.shape[0]
    D = HEAD_DIM
    tensors = {"qkv": qkv, "k_cache": k_cache, "v_cache": v_cache, "out": out}
    if any(t.dtype != torch.bfloat16 or t.dim() != 2 or t.stride(1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16
           for t in tensors.values()):
        raise ValueError("cluster_step_attention: qkv, the caches and out must be bf16 matrices with contiguous, "
                         "16-byte aligned rows; got " + ", ".join(f"{n} {tuple(t.shape)} {t.dtype} stride "
                                                                  f"{t.stride()}" for n, t in tensors.items()))
    if qkv.shape[1] != (heads + 2) * D or k_cache.shape[1] != D or v_cache.shape != k_cache.shape \
            or k_cache.stride(0) != v_cache.stride(0) or k_cache.shape[0] < prefix_len \
            or out.shape != (tokens * heads, D):
        raise ValueError(f"cluster_step_attention: qkv ({tokens}, {(heads + 2) * D}), caches (>= {prefix_len}, {D}) "
                         f"alike, out ({tokens * heads}, {D}); got qkv {tuple(qkv.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}, out {tuple(out.shape)}")
    if pos.shape != (tokens,) or pos.dtype != torch.int64 or visible.shape != (tokens,) \
            or visible.dtype != torch.int32 or cos.shape[1] != D // 2 or cos.dtype != torch.float32 \
            or sin.shape != cos.shape or sin.dtype != torch.float32 or bias.shape[0] < prefix_len \
            or bias.dtype != torch.float32 or not all(t.is_contiguous() for t in (pos, visible, cos, sin, bias)):
        raise ValueError(f"cluster_step_attention: pos ({tokens},) int64, visible ({tokens},) int32, contiguous fp32 "
                         f"rope tables (positions, {D // 2}) and bias over the {prefix_len} prefix keys; got pos "
                         f"{tuple(pos.shape)} {pos.dtype}, visible {tuple(visible.shape)} {visible.dtype}, tables "
                         f"{tuple(cos.shape)} {cos.dtype}, bias {tuple(bias.shape)} {bias.dtype}")
    if not 1 <= prefix_len or prefix_len + tokens > max_keys():
        raise ValueError(f"cluster_step_attention: at most {max_keys()} keys (prefix + suffix); got "
                         f"{prefix_len} + {tokens}")
    stream = torch.cuda.current_stream(qkv.device).cuda_stream
    err = library().step_attention(qkv.data_ptr(), qkv.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                   k_cache.stride(0), pos.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                   bias.data_ptr(), prefix_len, visible.data_ptr(), tokens, heads, float(q_scale),
                                   out.data_ptr(), out.stride(0), int(pdl), stream)
    if err != 0:
        raise RuntimeError(f"cluster_step_attention: the launch failed with CUDA error {err}")
    return out


__all__ = ["cluster_step_attention", "step_attention_supported"]
