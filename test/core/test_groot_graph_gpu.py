"""GR00T N1.6's graph executor on CUDA: the captured replay equals the reference executor (tiny, fp32) with the
fused DiT on and off, the policy picks it by default and the engine options' switches turn it off, FP8
(precision="fp8": weight-only E4M3 on the fused DiT's GEMMs, engine/groot_dit_gemms.py) replays what it runs eagerly and
is refused where it cannot run, and at the released sizes (random bf16 sharded checkpoint) the bf16 chunk, with the
fused DiT (engine/groot_fused_dit.py: Triton norms, GELU epilogue) on and off, and the FP8 chunk pass GR00T's
accuracy gate (engine/groot_gate.py) against the fp32 reference on the same weights."""

import dataclasses
import time

import numpy as np
import pytest
import torch

from flashrt_core import load_model
from flashrt_core.engine import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.dispatch import resolve
from flashrt_core.engine.groot_dit_gemms import PARTIALS, dit_gemms
from flashrt_core.engine.groot_gate import gate, gripper_dims
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_language import prepare_language
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, language_features
from flashrt_core.engine.hardware import detect_hardware
from flashrt_core.engine.kernel_configs import SkinnyConfig
from flashrt_core.engine.ops import Ops
from flashrt_core.engine.timing import graph_replay_ms
from flashrt_core.groot_fixtures import random_groot_model, write_random_groot_checkpoint
from flashrt_core.groot_policy import GrootReferenceExecutor
from flashrt_core.model.groot.config import get_groot_config

pytestmark = pytest.mark.gpu
TINY = "groot_n1.6_tiny"


def tiny_inputs(cfg, sizes, text, seed, device):
    gen = torch.Generator().manual_seed(seed)
    views = [(torch.rand(3, h, w, generator=gen) * 2 - 1).to(device) for h, w in sizes]
    pieces = [torch.randint(0, cfg.image_token_index, (text,), generator=gen)]
    for h, w in sizes:
        pieces += [torch.tensor([7]), torch.full((cfg.image_tokens(h, w),), cfg.image_token_index), torch.tensor([8])]
    ids = torch.cat(pieces)[None]
    return (views, ids.to(device), torch.ones_like(ids, dtype=torch.bool).to(device),
            (torch.rand(1, 1, cfg.max_state_dim, generator=gen) * 2 - 1).to(device), torch.tensor([3]).to(device),
            torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=gen).to(device))


@pytest.mark.parametrize("fused_dit", [True, False])
@pytest.mark.parametrize("sizes, text", [([(56, 56)], 5), ([(56, 84), (56, 56)], 17), ([(84, 84), (84, 84)], 9)])
def test_tiny_replay_equals_the_reference(sizes, text, fused_dit):
    cuda = torch.device("cuda")
    model = random_groot_model(TINY, seed=5, device=cuda)                      # fp32
    ref = GrootReferenceExecutor(model, cuda)
    graph = GrootGraphExecutor(model, cuda, fused_dit=fused_dit)
    assert graph.capture and graph.name == "graph" and graph.fused_dit == fused_dit
    first = tiny_inputs(model.cfg, sizes, text, 1, cuda)
    got = graph.sample_actions(*first)                                          # captures
    torch.testing.assert_close(got, ref.sample_actions(*first), rtol=1e-4, atol=1e-4)
    (entry,) = graph.entries.values()
    assert entry.graph is not None
    second = tiny_inputs(model.cfg, sizes, text, 2, cuda)
    again = graph.sample_actions(*second)                                       # replays
    torch.testing.assert_close(again, ref.sample_actions(*second), rtol=1e-4, atol=1e-4)
    assert (again - got).abs().max() > 1e-3
    host = tiny_inputs(model.cfg, sizes, text, 3, torch.device("cpu"))         # staged through the pinned blob
    torch.testing.assert_close(graph.sample_actions(*host), ref.sample_actions(*tiny_inputs(
        model.cfg, sizes, text, 3, cuda)), rtol=1e-4, atol=1e-4)
    assert len(graph.entries) == 1                                              # one signature, one graph


def tiny_policy_case(tmp_path):
    """A tiny random checkpoint, two camera images, a state and noise, and the fp32 reference policy's chunk for
    them: (checkpoint, images, state, noise, chunk)."""
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=4)
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (72, 96, 3), dtype=np.uint8) for v in ("front", "wrist")}
    state, noise = rng.uniform(-1, 1, 6), rng.standard_normal((16, 16)).astype(np.float32)
    ref = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", hardware="reference")
    return ckpt, images, state, noise, ref.predict(images, "pick up the cube", state, noise)


def test_policy_executor_and_its_switches(tmp_path):
    ckpt, images, state, noise, want = tiny_policy_case(tmp_path)
    for options, name, tables, fused in (
            (None, "graph", True, True), (EngineOptions(groot_fused_dit=False), "graph", True, False),
            (EngineOptions(groot_step_tables=False), "graph", False, False),
            (EngineOptions(cuda_graph=False), "static-eager", True, True),
            (EngineOptions(fast_paths=False), "reference", None, None)):
        pol = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", engine_options=options)
        assert pol.executor.name == name and getattr(pol.executor, "step_tables", None) == tables
        assert getattr(pol.executor, "fused_dit", None) == fused
        np.testing.assert_allclose(pol.predict(images, "pick up the cube", state, noise), want, rtol=1e-4, atol=1e-4)
    fp8 = load_model(ckpt, embodiment="new_embodiment", device="cuda", precision="fp8")
    assert fp8.executor.name == "graph" and fp8.executor.fp8 and fp8.executor.fused_dit
    got = fp8.predict(images, "pick up the cube", state, noise)
    assert np.isfinite(got).all() and gate([got], [want]).worst > 0.99     # E4M3 weights, bf16 activations
    with pytest.raises(ValueError, match="weight-only FP8 weights in the fused DiT: turn groot_fused_dit"):
        load_model(ckpt, embodiment="new_embodiment", device="cuda", precision="fp8",
                   engine_options=EngineOptions(groot_fused_dit=False))
    with pytest.raises(ValueError, match=r"precision='fp8' cannot run on hardware='reference'"):
        load_model(ckpt, embodiment="new_embodiment", device="cuda", precision="fp8", hardware="reference")
    with pytest.raises(ValueError, match="which this dispatch does not run"):
        load_model(ckpt, embodiment="new_embodiment", device="cuda", precision="fp8",
                   engine_options=EngineOptions(triton=False))


def test_the_warm_up_captures_every_prompt_length_and_a_later_instruction_replays(tmp_path):
    """GrootPolicy.warm_up_text_buckets on the CUDA graph executor: every signature it makes is captured, an
    instruction within its bound then replays one of those graphs (no new capture) and gives the reference's
    chunk."""
    ckpt, images, state, noise, want = tiny_policy_case(tmp_path)
    policy = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32")
    assert policy.executor.name == "graph"
    warmed = policy.warm_up_text_buckets(images, "pick up the cube", state)
    graphs = policy.executor.capture_seconds
    assert warmed and len(graphs) >= len(warmed) and all(entry.graph is not None
                                                          for entry in policy.executor.entries.values())
    captured = dict(graphs)
    np.testing.assert_allclose(policy.predict(images, "pick up the cube", state, noise), want, rtol=1e-4, atol=1e-4)
    assert policy.executor.capture_seconds == captured                        # replayed a warmed-up graph


def test_tiny_fp8_replay_equals_its_eager_run():
    """The FP8 graph replays what the same FP8 code computes launched one by one (capture=False), with the split-K
    partials of the output projection and MLP down summed in the norms, and stays near the fp32 reference."""
    cuda = torch.device("cuda")
    model = random_groot_model(TINY, seed=5, device=cuda)
    graph = GrootGraphExecutor(model, cuda, fp8=True)
    eager = GrootGraphExecutor(model, cuda, capture=False, fp8=True)
    for executor in (graph, eager):          # tiny K (32, 128): force split-K 2 where the norms sum partials
        for lin, kind in dit_gemms(executor._fused):
            if kind == PARTIALS and lin.parts[0][0].shape[1] % 32 == 0:
                executor._fused.few_row[id(lin)] = SkinnyConfig(16, 16, 2, 1)
    ref = GrootReferenceExecutor(model, cuda)
    for seed in (1, 2):
        args = tiny_inputs(model.cfg, [(56, 84), (56, 56)], 9, seed, cuda)
        got = graph.sample_actions(*args)
        torch.testing.assert_close(got, eager.sample_actions(*args), rtol=1e-5, atol=1e-5)
        assert gate([got.cpu().numpy()], [ref.sample_actions(*args).cpu().numpy()]).worst > 0.998


@pytest.mark.parametrize("rows", [17, 34, 68, 136])       # 1, 2, 4, 8 observations: above 64 rows in row blocks
@pytest.mark.parametrize("gelu, split", [(False, 1), (True, 1), (False, 4)])
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
def test_few_row_linear_at_the_dits_shapes(rows, gelu, split, fp8):
    """Ops.few_row_linear (bias and GELU in the epilogue, split-K partials, row blocks past 64 rows) against the
    plain-PyTorch reference on the same weights (weight-only FP8 or bf16), at the DiT's MLP shapes."""
    from flashrt_core.engine.dispatch import resolve
    from flashrt_core.engine.fp8 import weight_only_fp8
    from flashrt_core.engine.hardware import detect_hardware
    from flashrt_core.engine.weights import Linear
    g = torch.Generator(device="cuda").manual_seed(rows)
    n, k = (6144, 1536) if split == 1 else (1536, 6144)
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(torch.bfloat16)
    lin = Linear([(w, (torch.randn(n, device="cuda", generator=g) * 0.1).to(torch.bfloat16))])
    q = weight_only_fp8(Linear([(w, None)]), torch.float8_e4m3fn)
    lin.w8 = q.w8 if fp8 else None
    x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
    cfg = SkinnyConfig(16, 256, split, 4)
    ops = Ops(resolve(detect_hardware("auto", torch.device("cuda"))))
    got = ops.few_row_linear(x, lin, cfg, gelu=gelu).float()
    want = Ops(eager_cpu_dispatch()).few_row_linear(
        x.cpu().float(), Linear([(w.cpu(), lin.parts[0][1].cpu())],
                                w8=(q.w8[0].cpu(), q.w8[1].cpu()) if fp8 else None), cfg, gelu=gelu)
    if got.dim() == 3:                       # split-K partials (rows <= 64): the norm after them sums them
        got = got.sum(0)
    want = want.sum(0) if want.dim() == 3 else want
    assert got.shape == (rows, n) and torch.isfinite(got).all()
    assert (got.cpu() - want).norm() / want.norm() < 1e-2


def test_split_k_gemms_are_timed_with_their_norm():
    """groot_tune_with_norm: pick_config times a split-K GEMM of the DiT's MLP-down shape (4 weights, 17 rows) with
    the LayerNorm that sums its partials after it: the same candidates, each timed with the norm's time added."""
    from flashrt_core.engine.groot_dit_gemms import pick_config
    from flashrt_core.engine.weights import Linear
    g = torch.Generator(device="cuda").manual_seed(0)
    lins = [Linear([((torch.randn(1536, 6144, device="cuda", generator=g) * 0.02).to(torch.bfloat16), None)])
            for _ in range(4)]
    ops = Ops(resolve(detect_hardware("auto", torch.device("cuda"))))
    _, alone = pick_config(ops, lins, PARTIALS, 17, torch.bfloat16, with_norm=False)
    _, paired = pick_config(ops, lins, PARTIALS, 17, torch.bfloat16, with_norm=True)
    assert alone.keys() == paired.keys() and len(alone) > 1
    assert sum(paired.values()) > sum(alone.values())


LANGUAGE_ERROR_RATIO = 1.25    # the engine's bf16 error against fp32 over transformers' bf16 error, at most


@pytest.mark.parametrize("pad", [0, 12])
def test_engine_language_model_at_the_released_width(pad):
    """The engine's Qwen3 layers (engine/groot_language.py: Triton norms, q/k-norm RoPE, SwiGLU, SDPA's causal GQA
    kernels) at Qwen3-1.7B's width, four layers in bf16, against the fp32 transformers layers on the same weights
    and embeddings: the real tokens' relative error is at most LANGUAGE_ERROR_RATIO times that of transformers'
    own bf16 layers, with and without prompt padding (the masked kernel)."""
    cuda = torch.device("cuda")
    base = get_groot_config("groot_n1.6")
    cfg = base.replace(llm=dataclasses.replace(base.llm, num_layers=4),
                       vision=dataclasses.replace(base.vision, depth=1),
                       dit=dataclasses.replace(base.dit, num_layers=2))
    model32 = random_groot_model(cfg, seed=3, device=cuda)
    model16 = random_groot_model(cfg, seed=3, dtype=torch.bfloat16, device=cuda)
    length = 208
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, cfg.image_token_index, (1, length), generator=gen)
    ids[0, 3:165] = cfg.image_token_index                                           # two views' image slots
    ids = ids.to(cuda)
    mask = torch.ones_like(ids, dtype=torch.bool)
    if pad:
        mask[0, -pad:] = False
    vit = torch.randn(162, cfg.llm.width, generator=gen).to(cuda, torch.bfloat16)
    sig = GrootSignature.of([], ids, mask)
    lang = prepare_language(model16, Ops(resolve(detect_hardware("auto", cuda))))
    with torch.inference_mode():
        truth = language_features(model32, StaticTables(model32, sig, cuda), vit.float(), ids, mask).float()
        hf = language_features(model16, StaticTables(model16, sig, cuda), vit, ids, mask).float()
        got = language_features(model16, StaticTables(model16, sig, cuda, language=lang), vit, ids, mask).float()
    real = length - pad
    err = lambda x: float((x[0, :real] - truth[0, :real]).norm() / truth[0, :real].norm())  # noqa: E731
    assert torch.isfinite(got[0, :real]).all() and err(hf) > 0
    assert err(got) <= LANGUAGE_ERROR_RATIO * err(hf), (err(got), err(hf))


def test_released_sizes_pass_the_gate(tmp_path):
    """The bf16 graph with the fused DiT (the default), without it and with its GEMMs on cuBLAS, and the FP8 graph, each against the fp32
    reference: GR00T's gate (cosine mean and worst, no sign flip of the gripper column)."""
    ckpt = write_random_groot_checkpoint(tmp_path / "full", "groot_n1.6", seed=0, shards=4, dtype=torch.bfloat16)
    ref32 = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", hardware="reference")
    assert ref32.executor.name == "reference"
    rng = np.random.default_rng(0)
    observations = []
    for _ in range(4):
        images = {v: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for v in ref32.view_names}
        state = rng.uniform(-1, 1, ref32.state_dim)
        noise = rng.standard_normal((16, 128)).astype(np.float32)
        want = ref32.executor.sample_actions(*ref32.prepare_inputs(images, "pick up the cube", state, noise))
        observations.append((images, state, noise, want.float().cpu().numpy()))
    grippers = gripper_dims(ref32.action_groups)
    assert grippers == (5,)                                   # the fixtures' layout: single_arm 5, gripper 1
    del ref32
    for label, options, precision in (("bf16, fused DiT", None, None),
                                      ("bf16, no fused DiT", EngineOptions(groot_fused_dit=False), None),
                                      ("bf16, DiT GEMMs on cuBLAS", EngineOptions(groot_few_row_gemms=False), None),
                                      ("FP8 DiT", None, "fp8")):
        graph = load_model(ckpt, embodiment="new_embodiment", device="cuda", engine_options=options,
                           precision=precision)
        assert graph.executor.name == "graph" and graph.executor.fused_dit == (options is None or options.groot_fused_dit)
        assert graph.executor.fp8 == (precision == "fp8")
        _gate_and_times(graph, observations, label, grippers)
        graph.close()
        del graph
        torch.cuda.empty_cache()


def _gate_and_times(graph, observations, label: str, grippers) -> None:
    chunks = []
    for images, state, noise, want in observations:
        got = graph.executor.sample_actions(*graph.prepare_inputs(images, "pick up the cube", state, noise))
        assert torch.isfinite(got).all()
        chunks.append(got.float().cpu().numpy())
    result = gate(chunks, [want for *_, want in observations], grippers)
    inputs = graph.prepare_inputs(images, "pick up the cube", state, noise)
    times = []
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.executor.sample_actions(*inputs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    (entry,) = graph.executor.entries.values()
    replay = graph_replay_ms(entry.graph, 30)
    phases = graph.executor.phase_times(reps=10)
    print(f"GR00T N1.6 graph ({label}), 2 views 224x224 (252x252): sample_actions median "
          f"{np.median(times):.2f} ms, replay median {np.median(replay):.2f} ms (phases {phases}); gate vs fp32: "
          f"{result}")
    assert set(phases) == {"vision", "language", "action_head"} and min(phases.values()) > 0
    assert 0.7 < sum(phases.values()) / np.median(replay) < 1.3       # the phases make up the whole graph
    assert result.passed, f"{label}: {result}"
