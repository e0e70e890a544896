"""kernels/flashrt_kernels/step_attention.py on the CPU: the launcher names what is wrong with its inputs before
it builds or launches anything (the kernel itself runs in test/gpu/test_kernels.py)."""

import pytest
import torch

from flashrt_kernels.step_attention import HEAD_DIM, cluster_step_attention, step_attention_supported

HEADS, TOKENS, PREFIX = 8, 10, 560


def _inputs(**change):
    d = HEAD_DIM
    args = {"qkv": torch.zeros(TOKENS, (HEADS + 2) * d, dtype=torch.bfloat16),
            "k_cache": torch.zeros(PREFIX + TOKENS, d, dtype=torch.bfloat16),
            "v_cache": torch.zeros(PREFIX + TOKENS, d, dtype=torch.bfloat16),
            "pos": torch.arange(TOKENS), "cos": torch.zeros(PREFIX + TOKENS, d // 2),
            "sin": torch.zeros(PREFIX + TOKENS, d // 2), "bias": torch.zeros(PREFIX), "prefix_len": PREFIX,
            "visible": torch.full((TOKENS,), TOKENS, dtype=torch.int32), "heads": HEADS, "q_scale": d ** -0.5,
            "out": torch.zeros(TOKENS * HEADS, d, dtype=torch.bfloat16)}
    args.update(change)
    return args


@pytest.mark.parametrize("change,message", [
    ({"qkv": torch.zeros(TOKENS, (HEADS + 2) * HEAD_DIM)}, "bf16 matrices"),
    ({"out": torch.zeros(TOKENS * HEADS, HEAD_DIM, dtype=torch.bfloat16).t()}, "contiguous"),
    ({"qkv": torch.zeros(TOKENS, HEADS * HEAD_DIM, dtype=torch.bfloat16)}, r"qkv \(10, 2560\)"),
    ({"k_cache": torch.zeros(PREFIX - 1, HEAD_DIM, dtype=torch.bfloat16)}, "caches"),
    ({"pos": torch.arange(TOKENS, dtype=torch.int32)}, "pos"),
    ({"visible": torch.full((TOKENS,), TOKENS)}, "visible"),
    ({"bias": torch.zeros(PREFIX - 1)}, "bias"),
])
def test_bad_inputs_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        cluster_step_attention(**_inputs(**change))


def test_the_cpu_is_not_served():
    assert not step_attention_supported(TOKENS, PREFIX, HEAD_DIM, torch.device("cpu"))
