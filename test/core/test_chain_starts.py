"""EngineExecutor._chain_starts (EngineOptions.chain_tuning_starts), the search itself, on a landscape with two local
optima. The chain tuning times captured denoisers on the GPU; here the same methods run with a cost function in
place of the capture and the timer, so what is checked is the search: which starts it runs, that each start's GEMM
pass runs under its own launch policy, and that it keeps the fastest end even when the first timing ranks its
policy second (the case seen on the H200 in session 16: "norms" first with the isolated picks, "all" with the TMA
down GEMM faster in the end)."""

from __future__ import annotations

import types

from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.ops import LAUNCH_POLICIES, Ops

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
    from flashrt_core.engine.graph_executor import keep_fastest_in_chain
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
