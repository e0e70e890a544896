"""The chain tuning's search (EngineExecutor: _chain_starts, _pick_launch_policy, _pick_decoder_gemm_in_chain,
_pick_decoder_attention_in_chain, keep_fastest_in_chain). The chain tuning times captured denoisers on the GPU; here
the same methods run with a cost function in place of the capture and the timer, so what is checked is the search:
which candidates it captures under which settings, what it leaves out, and what it keeps.

_chain_starts (EngineOptions.chain_tuning_starts) runs on a landscape with two local optima: which starts it runs,
that each start's GEMM pass runs under its own launch policy, and that it keeps the fastest end even when the first
timing ranks its policy second (the case seen on the H200 in session 16: "norms" first with the isolated picks,
"all" with the TMA down GEMM faster in the end)."""

from __future__ import annotations

import types

import pytest
import torch

from flashrt_core.engine.graph_executor import EngineExecutor, keep_fastest_in_chain
from flashrt_core.engine.ops import LAUNCH_POLICIES, OUT_OF_RESOURCES, CandidateMismatch, Ops

POLICY_MS = {"none": 5.0, "all": 4.6, "before_one_shot": 4.9, "attention_block": 4.8, "norms": 4.4,
             "mlp_block": 4.9}
CANDIDATES = {"down": ["triton", "tma"], "o": ["tma_s2", "tma_s4"], "gate_up": ["tma"], "qkv": ["tma"]}


def _search(starts: int):
    ops = types.SimpleNamespace(decoder_impl={"down": "triton", "o": "tma_s4", "gate_up": "tma", "qkv": "tma"},
                                launch_policy="all", early_sites=LAUNCH_POLICIES["all"])
    ops.set_launch_policy = types.MethodType(Ops.set_launch_policy, ops)
    seen = []

    def cost() -> float:
        """ms per denoise: a policy's own time, "all" 0.5 ms faster with the TMA down GEMM, "norms" 0.05 faster
        with the Triton one and 0.1 slower with the TMA one, O split-K 2 0.01 faster everywhere."""
        policy = next(p for p, sites in LAUNCH_POLICIES.items() if sites == ops.early_sites)
        seen.append((policy, dict(ops.decoder_impl)))
        ms = POLICY_MS[policy] - (0.01 if ops.decoder_impl["o"] == "tma_s2" else 0.0)
        if policy == "all" and ops.decoder_impl["down"] == "tma":
            ms -= 0.5
        if policy == "norms":
            ms += -0.05 if ops.decoder_impl["down"] == "triton" else 0.1
        return ms

    def pick(self, kind, capture, timed):                 # _pick_decoder_gemm_in_chain's contract
        times = {}
        for impl in CANDIDATES[kind]:
            ops.decoder_impl[kind] = impl
            times[impl] = capture()
        ops.decoder_impl[kind] = min(times, key=times.get)
        return times

    ex = types.SimpleNamespace(ops=ops)
    ex._pick_launch_policy = types.MethodType(EngineExecutor._pick_launch_policy, ex)
    ex._pick_decoder_gemm_in_chain = types.MethodType(pick, ex)
    ends = EngineExecutor._chain_starts(ex, starts, cost, lambda graphs: dict(graphs))
    return ops, ends, seen


def test_several_starts_keep_the_end_a_single_start_misses():
    ops, ends, seen = _search(2)
    assert list(ends) == ["norms", "all"]                              # the two fastest with the isolated picks
    assert ends["norms"]["picks"]["down"] == "triton" and ends["all"]["picks"]["down"] == "tma"
    assert round(ends["all"]["ms"], 3) == 4.09 and round(ends["norms"]["ms"], 3) == 4.34
    assert ends["all"]["kept"] and not ends["norms"]["kept"]
    assert ops.launch_policy == "all" and ops.early_sites == LAUNCH_POLICIES["all"]
    assert ops.decoder_impl == {"down": "tma", "o": "tma_s2", "gate_up": "tma", "qkv": "tma"}
    # each start's GEMM pass ran under its own policy and from the isolated picks: "all"'s first evaluation after
    # the launch-policy timing has O at its isolated split-K 4, not the split-K 2 that the "norms" start picked
    under_all = [impl for policy, impl in seen if policy == "all"]
    assert under_all[1] == {"down": "triton", "o": "tma_s4", "gate_up": "tma", "qkv": "tma"}, under_all
    assert {impl["down"] for policy, impl in seen if policy == "norms"} == {"triton", "tma"}


def test_one_start_is_the_fastest_first_policy_with_its_own_gemms():
    ops, ends, _ = _search(1)
    assert list(ends) == ["norms"] and ends["norms"]["kept"]
    assert ops.launch_policy == "norms" and ops.decoder_impl["down"] == "triton"


def test_keep_fastest_in_chain_applies_each_candidate_then_the_fastest_or_the_fallback():
    """The chain tuning's one choice (the launch policy, a GEMM kind, the attention form, the starts' ends): each
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


def _picking_executor(ops) -> types.SimpleNamespace:
    """An executor with the two per-choice methods of the chain tuning bound to it, pi0.5's expert shape, on the CPU
    (the methods only build x for ops.decoder_candidates there)."""
    lin = types.SimpleNamespace(parts=[(torch.empty(1024, 2048), None)])
    expert = types.SimpleNamespace(down=lin, o=lin, gate_up=lin, qkv=None)      # qkv: a kind with no weights here
    ex = types.SimpleNamespace(ops=ops, weights=types.SimpleNamespace(expert=[expert]), suffix_len=10,
                               device=torch.device("cpu"), dtype=torch.float32,
                               config=types.SimpleNamespace(expert=types.SimpleNamespace(num_heads=8, head_dim=256)))
    for name in ("_pick_decoder_gemm_in_chain", "_pick_decoder_attention_in_chain"):
        setattr(ex, name, types.MethodType(getattr(EngineExecutor, name), ex))
    return ex


def _gemm_ops(candidates: list[str], failed_before: dict[str, str]) -> types.SimpleNamespace:
    ops = types.SimpleNamespace(decoder_impl={"down": "library", "o": "library"}, decoder_timings={"down": {}},
                                decoder_failures={"down": dict(failed_before)},
                                decoder_candidates=lambda kind, x, lin, head_dim: list(candidates))
    ops.time_candidate = types.MethodType(Ops.time_candidate, ops)                 # the real failure handling
    return ops


def test_gemm_pick_times_every_runnable_candidate_keeps_the_fastest_and_records_a_capture_failure():
    """_pick_decoder_gemm_in_chain: the candidates the isolated tuning recorded as failed are never applied, one
    whose capture raises a candidate's failure (CandidateMismatch) is left out and recorded, the others are captured
    with themselves applied and timed, and the fastest is kept; the kinds the isolated tuning did not tune, and
    those without weights, are left as they are."""
    ops = _gemm_ops(["library", "skinny", "tma_failed_alone", "tma_mismatch", "tma_fast"],
                    {"tma_failed_alone": "OutOfResources(...)"})
    ms = {"library": 4.6, "skinny": 4.4, "tma_fast": 4.3}
    ex = _picking_executor(ops)
    captured = []

    def capture():
        impl = ops.decoder_impl["down"]
        captured.append(impl)
        if impl == "tma_mismatch":
            raise CandidateMismatch("off by 0.3 against the library GEMM")
        return f"graph-{impl}"
    times = ex._pick_decoder_gemm_in_chain("down", capture, lambda graphs: {c: ms[c] for c in graphs})
    assert times == ms
    assert captured == ["library", "skinny", "tma_mismatch", "tma_fast"]
    assert ops.decoder_impl["down"] == "tma_fast"
    assert set(ops.decoder_failures["down"]) == {"tma_failed_alone", "tma_mismatch"}
    assert ex._pick_decoder_gemm_in_chain("o", capture, None) == {}          # not tuned alone: pinned
    assert ex._pick_decoder_gemm_in_chain("qkv", capture, None) == {}        # no weights of that kind
    assert ops.decoder_impl == {"down": "tma_fast", "o": "library"}

    other = RuntimeError("an engine bug, not a candidate's failure")
    def broken():
        raise other
    with pytest.raises(RuntimeError) as raised:                             # raised, never swallowed
        ex._pick_decoder_gemm_in_chain("down", broken, None)
    assert raised.value is other


def test_gemm_pick_keeps_the_current_pick_when_no_candidate_captures():
    ops = _gemm_ops(["library", "skinny"], {})                           # the pick before the pass: "library"
    ex = _picking_executor(ops)

    def capture():
        raise CandidateMismatch("every candidate disagrees")
    assert ex._pick_decoder_gemm_in_chain("down", capture, lambda graphs: pytest.fail("nothing to time")) == {}
    assert ops.decoder_impl["down"] == "library"                        # not the last one applied
    assert set(ops.decoder_failures["down"]) == {"library", "skinny"}


def test_attention_pick_leaves_out_a_form_that_disagrees_or_does_not_fit_and_keeps_the_fastest():
    """_pick_decoder_attention_in_chain (decoder_attention_tuning): each form checked against the fp32 attention
    before its capture, with itself set; a form that disagrees is never captured, one that needs more than the GPU
    has (Triton's OutOfResources at its capture) is left out; the fastest of the rest is kept, or the form before
    the pass where none is left; nothing to choose between: {} and the form untouched."""
    forms = ["m16_k64", "m32_k64", "m64_k32", "m16_k16"]
    checked, captured = [], []

    def check(form, rows, prefix_len, heads, head_dim, dtype, device):
        assert (rows, prefix_len, heads, head_dim) == (10, 560, 8, 256)
        checked.append(form)
        if form in bad:
            raise CandidateMismatch(f"{form} off by 0.2")
    ops = types.SimpleNamespace(decoder_attention_form=None, check_attention_form=check,
                                decoder_attention_forms=lambda rows, prefix_len, heads, head_dim: list(forms))
    ex = _picking_executor(ops)

    def capture():
        captured.append(ops.decoder_attention_form)
        if ops.decoder_attention_form in too_large:
            raise OUT_OF_RESOURCES[0](262144, 232448, "shared memory")
        return f"graph-{ops.decoder_attention_form}"
    ms = {"m16_k64": 4.5, "m32_k64": 4.4, "m64_k32": 4.0, "m16_k16": 3.9}
    bad, too_large = {"m64_k32"}, {"m16_k16"}
    times = ex._pick_decoder_attention_in_chain(560, capture, lambda graphs: {f: ms[f] for f in graphs})
    assert times == {"m16_k64": 4.5, "m32_k64": 4.4}
    assert checked == forms and captured == ["m16_k64", "m32_k64", "m16_k16"]
    assert ops.decoder_attention_form == "m32_k64"

    bad, too_large = set(forms[:2]), set(forms[2:])                          # none left: the form before stays
    assert ex._pick_decoder_attention_in_chain(560, capture, lambda graphs: pytest.fail("nothing to time")) == {}
    assert ops.decoder_attention_form == "m32_k64"

    forms = ["m16_k64"]                                                      # one form: nothing to choose between
    checked.clear()
    assert ex._pick_decoder_attention_in_chain(560, capture, None) == {} and checked == []
