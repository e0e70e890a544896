"""The chain tuning's search (engine/load_tuning.py: pick_launch_policy, pick_decoder_gemm_in_chain,
keep_fastest_in_chain). The chain tuning times captured denoisers on the GPU; here the same methods run with a cost
function in place of the capture and the timer, so what is checked is the search: which candidates it captures under
which settings, what it leaves out, and what it keeps."""

from __future__ import annotations

import types

import pytest
import torch

from flashrt_core.engine import load_tuning, tuning
from flashrt_core.engine.kernel_configs import LAUNCH_POLICIES
from flashrt_core.engine.load_tuning import keep_fastest_in_chain
from flashrt_core.engine.ops import Ops
from flashrt_core.engine.tuning import CandidateMismatch


def test_keep_fastest_in_chain_applies_each_candidate_then_the_fastest_or_the_fallback():
    """The chain tuning's one choice (the launch policy, a GEMM kind): each
    candidate applied before its capture, a candidate whose capture gives None left out of the timing, the fastest
    timed one applied last; where none could be captured, the fallback."""
    applied, captured = [], []
    ms = {"a": 3.0, "b": 1.0, "c": 2.0, "broken": 0.5}

    def capture(cand):
        captured.append((cand, applied[-1]))
        return None if cand == "broken" else f"graph-{cand}"
    times = keep_fastest_in_chain(list(ms), applied.append, capture,
                                  lambda graphs: {c: ms[c] for c, g in graphs.items() if g == f"graph-{c}"},
                                  fallback="a")
    assert times == {"a": 3.0, "b": 1.0, "c": 2.0}                   # "broken" left out, not timed
    assert captured == [(c, c) for c in ms]                           # each captured with itself applied
    assert applied == ["a", "b", "c", "broken", "b"]                  # the fastest timed one kept
    applied.clear()
    assert keep_fastest_in_chain(["x"], applied.append, lambda _: None, lambda g: {}, fallback="kept") == {}
    assert applied == ["x", "kept"]


def test_launch_policy_pick_captures_every_policy_under_its_own_sites_and_keeps_the_fastest():
    """pick_launch_policy: every kernel_configs.LAUNCH_POLICIES entry set (its name and early sites together) before its
    capture, all timed, the fastest set last."""
    ops = types.SimpleNamespace(launch_policy="all", early_sites=LAUNCH_POLICIES["all"])
    ops.set_launch_policy = types.MethodType(Ops.set_launch_policy, ops)
    ex = types.SimpleNamespace(ops=ops)
    ms = {"none": 5.0, "all": 4.6, "before_one_shot": 4.9, "attention_block": 4.8, "norms": 4.4, "mlp_block": 4.9}
    captured = []

    def capture():
        captured.append((ops.launch_policy, ops.early_sites))
        return f"graph-{ops.launch_policy}"
    times = load_tuning.pick_launch_policy(ex, capture,
                                           lambda graphs: {p: ms[p] for p, g in graphs.items() if g == f"graph-{p}"})
    assert times == ms
    assert captured == [(p, LAUNCH_POLICIES[p]) for p in LAUNCH_POLICIES]
    assert ops.launch_policy == "norms" and ops.early_sites == LAUNCH_POLICIES["norms"]


def _picking_executor(ops) -> types.SimpleNamespace:
    """An executor with the two per-choice methods of the chain tuning bound to it, pi0.5's expert shape, on the CPU
    (the methods only build x for ops.decoder_candidates there)."""
    lin = types.SimpleNamespace(parts=[(torch.empty(1024, 2048), None)])
    expert = types.SimpleNamespace(down=lin, o=lin, gate_up=lin, qkv=None)      # qkv: a kind with no weights here
    ex = types.SimpleNamespace(ops=ops, weights=types.SimpleNamespace(expert=[expert]), suffix_len=10,
                               device=torch.device("cpu"), dtype=torch.float32,
                               config=types.SimpleNamespace(expert=types.SimpleNamespace(num_heads=8, head_dim=256)))
    return ex


def _gemm_ops(candidates: list[str], failed_before: dict[str, str], monkeypatch) -> types.SimpleNamespace:
    """Ops state of a decoder GEMM pick with these candidates; tuning.time_candidate (the real failure handling)
    runs on it."""
    monkeypatch.setattr(tuning, "decoder_candidates", lambda ops, kind, x, lin, head_dim: list(candidates))
    return types.SimpleNamespace(decoder_impl={"down": "library", "o": "library"}, decoder_timings={"down": {}},
                                 decoder_failures={"down": dict(failed_before)})


def test_gemm_pick_times_every_runnable_candidate_keeps_the_fastest_and_records_a_capture_failure(monkeypatch):
    """pick_decoder_gemm_in_chain: the candidates the isolated tuning recorded as failed are never applied, one
    whose capture raises a candidate's failure (CandidateMismatch) is left out and recorded, the others are captured
    with themselves applied and timed, and the fastest is kept; the kinds the isolated tuning did not tune, and
    those without weights, are left as they are."""
    ops = _gemm_ops(["library", "skinny", "tma_failed_alone", "tma_mismatch", "tma_fast"],
                    {"tma_failed_alone": "OutOfResources(...)"}, monkeypatch)
    ms = {"library": 4.6, "skinny": 4.4, "tma_fast": 4.3}
    ex = _picking_executor(ops)
    captured = []

    def capture():
        impl = ops.decoder_impl["down"]
        captured.append(impl)
        if impl == "tma_mismatch":
            raise CandidateMismatch("off by 0.3 against the library GEMM")
        return f"graph-{impl}"
    times = load_tuning.pick_decoder_gemm_in_chain(ex, "down", capture, lambda graphs: {c: ms[c] for c in graphs})
    assert times == ms
    assert captured == ["library", "skinny", "tma_mismatch", "tma_fast"]
    assert ops.decoder_impl["down"] == "tma_fast"
    assert set(ops.decoder_failures["down"]) == {"tma_failed_alone", "tma_mismatch"}
    assert load_tuning.pick_decoder_gemm_in_chain(ex, "o", capture, None) == {}          # not tuned alone: pinned
    assert load_tuning.pick_decoder_gemm_in_chain(ex, "qkv", capture, None) == {}        # no weights of that kind
    assert ops.decoder_impl == {"down": "tma_fast", "o": "library"}

    other = RuntimeError("an engine bug, not a candidate's failure")
    def broken():
        raise other
    with pytest.raises(RuntimeError) as raised:                             # raised, never swallowed
        load_tuning.pick_decoder_gemm_in_chain(ex, "down", broken, None)
    assert raised.value is other


def test_gemm_pick_keeps_the_current_pick_when_no_candidate_captures(monkeypatch):
    ops = _gemm_ops(["library", "skinny"], {}, monkeypatch)              # the pick before the pass: "library"
    ex = _picking_executor(ops)

    def capture():
        raise CandidateMismatch("every candidate disagrees")
    nothing_to_time = lambda graphs: pytest.fail("nothing to time")  # noqa: E731
    assert load_tuning.pick_decoder_gemm_in_chain(ex, "down", capture, nothing_to_time) == {}
    assert ops.decoder_impl["down"] == "library"                        # not the last one applied
    assert set(ops.decoder_failures["down"]) == {"library", "skinny"}
