"""uint8 camera image -> the patch rows of the vision tower's patch embedding (SigLIP's conv, run as a GEMM).

    G = S // p patches per side; row n = gy * G + gx, column k = c * p * p + py * p + px:
    rows[n, k] = img[gy * p + py, gx * p + px, c] / 255 * 2 - 1          (openpi's uint8 -> [-1, 1])

img: (S, S, 3) uint8 in the camera's HWC layout, as the engine stages it; rows: (G * G, 3 * p * p) in the engine
dtype, the left operand of the patch GEMM (its weight is the conv weight flattened, (Wv, 3 * p * p), same column
order). out may be wider than 3 * p * p: the kernel writes zeros in the extra columns, so a GEMM over a width padded
to a multiple of 8 (16-byte rows in bf16; 3 * 14 * 14 = 588 is not one, and cuBLAS runs unaligned operands on
slower kernels) gives the same product. One launch per view replaces what the engine ran before it: the HWC -> CHW
permute and float conversion, the scaling (torch's three elementwise kernels), the concatenation of the views and
the patch reshape copy; the GEMM after it then runs in the engine dtype instead of fp32.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton


def patch_rows_reference(img: torch.Tensor, patch: int, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain PyTorch. img (S, S, 3) uint8 -> (G * G, 3 * patch * patch) rows in out_dtype."""
    S = img.shape[0]
    G = S // patch
    x = img.permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0                               # (3, S, S)
    return x.view(3, G, patch, G, patch).permute(1, 3, 0, 2, 4).reshape(G * G, 3 * patch * patch).to(out_dtype)


@triton.jit
def _patch_rows_kernel(img_ptr, out_ptr, S, G, K, K_out, stride_out, P: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0)                                     # one patch (output row) per program
    gy = n // G
    gx = n % G
    k = tl.arange(0, BLOCK)
    ok = k < K
    c = k // (P * P)
    r = k % (P * P)
    src = ((gy * P + r // P) * S + gx * P + r % P) * 3 + c
    x = tl.load(img_ptr + src, mask=ok, other=0).to(tl.float32)
    y = x / 255.0 * 2.0 - 1.0
    y = tl.where(ok, y, 0.0)                                 # the padding columns K..K_out: zeros
    tl.store(out_ptr + n * stride_out + k, y.to(out_ptr.dtype.element_ty), mask=k < K_out)


def patch_rows(img: torch.Tensor, patch: int, out: torch.Tensor) -> torch.Tensor:
    """Triton launcher; contract of patch_rows_reference, written into out (G * G, >= 3 * patch * patch); columns past
    3 * patch * patch are written as zeros."""
    S = img.shape[0]
    G, K = S // patch, 3 * patch * patch
    if img.dtype != torch.uint8 or img.shape != (S, S, 3) or S % patch or not img.is_contiguous():
        raise ValueError(f"patch_rows: a contiguous uint8 (S, S, 3) image with S a multiple of the patch size "
                         f"{patch}; got {img.dtype} {tuple(img.shape)}")
    if out.dim() != 2 or out.shape[0] != G * G or out.shape[1] < K or out.stride(1) != 1 or out.device != img.device:
        raise ValueError(f"patch_rows: out must be ({G * G}, >= {K}) with contiguous rows on {img.device}; got "
                         f"{tuple(out.shape)} on {out.device}")
    _patch_rows_kernel[(G * G,)](img, out, S, G, K, out.shape[1], out.stride(0), P=patch,
                                 BLOCK=triton.next_power_of_2(out.shape[1]), num_warps=4)
    return out


__all__ = ["patch_rows", "patch_rows_reference"]
