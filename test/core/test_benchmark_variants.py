"""The engine benchmark's variant names turn into the EngineOptions they claim (tools/benchmark_engine.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tools.benchmark_engine import engine_options

ARGS = SimpleNamespace(text_buckets=[64, 128])


@pytest.mark.parametrize("variant,fp8,scaling,scope,pdl,l2_prefetch", [
    ("bf16", False, "tensor", "backbone_mlp", True, False),
    ("fp8", True, "tensor", "backbone_mlp", True, False),
    ("fp8row@backbone", True, "row", "backbone", True, False),
    ("bf16-no_pdl", False, "tensor", "backbone_mlp", False, False),
    ("bf16-with_l2_prefetch", False, "tensor", "backbone_mlp", True, True),
    ("fp8-with_l2_prefetch-no_pdl", True, "tensor", "backbone_mlp", False, True),
])
def test_variant_names_give_their_options(variant, fp8, scaling, scope, pdl, l2_prefetch, monkeypatch):
    for name in ("FLASHRT_FP8", "FLASHRT_DISABLE_PDL", "FLASHRT_L2_PREFETCH", "FLASHRT_DISABLE_L2_PREFETCH"):
        monkeypatch.delenv(name, raising=False)
    o = engine_options(variant, ARGS)
    assert (o.fp8, o.fp8_scaling, o.fp8_scope, o.pdl, o.l2_prefetch) == (fp8, scaling, scope, pdl, l2_prefetch)
    assert o.text_buckets == (64, 128)


def test_unknown_suffix_is_refused():
    with pytest.raises(ValueError, match="no_<switch> or with_<switch>"):
        engine_options("bf16-fast", ARGS)
    with pytest.raises(TypeError):                      # a switch EngineOptions does not have
        engine_options("bf16-with_warp_speed", ARGS)


def test_targets_skip_ab_variants():
    """A/B rows ("-with_"/"-no_" variants) are measured beside the engine rows but have no target of their own."""
    from tools.benchmark_engine import targets

    def row(variant, median):
        return {"config": "pi05", "views": 2, "horizon": 10, "variant": variant,
                "predict_ms": {"median": median, "p99": median * 1.01}}
    lines = targets([row("engine_bf16", 12.0), row("engine_bf16-with_l2_prefetch", 13.0),
                     row("engine_fp8-no_pdl", 12.5), row("reference_eager_bf16", 390.0)])
    text = "\n".join(lines)
    assert "engine bf16 median predict 12.00 ms vs target <= 8.0 ms: MISSED" in text
    assert "l2_prefetch" not in text and "no_pdl" not in text


def test_integer_option_suffix():
    o = engine_options("bf16-decoder_key_block=32", ARGS)
    assert o.decoder_key_block == 32 and not o.fp8
    with pytest.raises(ValueError, match="decoder_key_block"):
        engine_options("bf16-decoder_key_block=40", ARGS)
