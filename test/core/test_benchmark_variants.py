"""The engine benchmark's variant names turn into the EngineOptions they claim (tools/benchmark_engine.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tools.benchmark_engine import engine_options

ARGS = SimpleNamespace(text_buckets=[64, 128])


@pytest.mark.parametrize("variant,fp8,pdl,fused_quant", [
    ("bf16", False, True, True),
    ("fp8", True, True, True),
    ("bf16-no_pdl", False, False, True),
    ("fp8-no_fp8_fused_quant-no_pdl", True, False, False),
    ("fp8-no_pdl-with_pdl", True, True, True),
])
def test_variant_names_give_their_options(variant, fp8, pdl, fused_quant, monkeypatch):
    for name in ("FLASHRT_FP8", "FLASHRT_PDL", "FLASHRT_FP8_FUSED_QUANT"):
        monkeypatch.delenv(name, raising=False)
    o = engine_options(variant, ARGS)
    assert (o.fp8, o.pdl, o.fp8_fused_quant) == (fp8, pdl, fused_quant)
    assert o.text_buckets == (64, 128)


def test_unknown_suffix_is_refused():
    with pytest.raises(ValueError, match="no_<switch> or with_<switch>"):
        engine_options("bf16-fast", ARGS)
    with pytest.raises(TypeError):                      # a switch EngineOptions does not have
        engine_options("bf16-with_warp_speed", ARGS)
    with pytest.raises(ValueError, match="precision must be bf16 or fp8"):
        engine_options("fp8row", ARGS)


def test_targets_skip_ab_variants():
    """A/B rows ("-with_"/"-no_" variants) are measured beside the engine rows but have no target of their own."""
    from tools.benchmark_engine import targets

    def row(variant, median):
        return {"config": "pi05", "views": 2, "horizon": 10, "variant": variant,
                "predict_ms": {"median": median, "p99": median * 1.01}}
    lines = targets([row("engine_bf16", 12.0), row("engine_bf16-with_overlap_first_step", 13.0),
                     row("engine_fp8-no_pdl", 12.5), row("reference_eager_bf16", 390.0)])
    text = "\n".join(lines)
    assert "engine bf16 median predict 12.00 ms vs target <= 8.0 ms: MISSED" in text
    assert "overlap_first_step" not in text and "no_pdl" not in text


def test_integer_option_suffix():
    o = engine_options("bf16-chain_tuning_passes=1", ARGS)
    assert o.chain_tuning_passes == 1 and not o.fp8
    with pytest.raises(ValueError, match="chain_tuning_passes"):
        engine_options("bf16-chain_tuning_passes=9", ARGS)
