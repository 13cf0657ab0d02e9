"""GPU layer (-m gpu): the lean launch path, nn.Linear weights without a copy, CUDA-graph capture, providers."""
import pytest
import torch
import torch.nn.functional as F

from gen.measure.accuracy import rel_err

pytestmark = pytest.mark.gpu


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("provider", ["sm90", "sm100", "torch", "dispatched"])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 6144, 4096), (1000, 520, 320), (4097, 136, 64)])
def test_linear_weights_read_in_place_by_every_provider(provider, m, n, k):
    import generated.gemm as g

    if provider not in g.PROVIDERS and provider != "dispatched":
        pytest.skip(f"{provider} not shipped")
    if provider in ("sm90", "sm100") and g._RT.device(0)[0] != provider:
        pytest.skip(f"{provider} does not run here")
    x, w, bias = _randn(m, k), _randn(n, k), _randn(n)
    ref = F.silu(x.double() @ w.double().t() + bias.double())
    for _ in range(2):  # the second call takes the compiled-kernel fast path
        out = g.linear(x, w, bias, "silu") if provider == "dispatched" else g.run_provider(provider, x, w.t(), bias, "silu")
        assert rel_err(out, ref) < 1e-2, (provider, m, n, k)
        x = _randn(m, k)  # fresh inputs: a stale descriptor would read the old ones
        ref = F.silu(x.double() @ w.double().t() + bias.double())


def test_direct_path_equals_the_custom_op():
    import generated.attention as att
    import generated.gemm as g

    a, b = _randn(300, 256), _randn(512, 256).t()
    assert torch.equal(g.gemm(a, b, None, "relu"), g._op(a, b, None, "relu", torch.bfloat16))
    q, k, v = _randn(2, 8, 200, 128), _randn(2, 2, 300, 128), _randn(2, 2, 300, 128)
    o, lse = att._op(q, k, v, 128 ** -0.5, "causal", 0, 0, 0.0, None, True)
    o2, lse2 = att.attention(q, k, v, mod="causal", return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_attention_reads_projection_views_without_a_copy():
    """q/k/v viewed from a [B, L, H, D] projection output (transpose(1, 2)) are addressed by TMA with their strides."""
    import generated.attention as att

    target = att._RT.device(0)[0]
    if target not in ("sm90", "sm100"):
        pytest.skip("no Gluon variant here")
    qkv = _randn(2, 333, 3, 8, 128)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    out = att.run_provider(target, q, k, v, mod="causal")
    ref = att.run_provider("torch", q.contiguous(), k.contiguous(), v.contiguous(), mod="causal")
    assert rel_err(out, ref.double()) < 1e-2


def _captured_and_replayed(step, inputs):
    """step()'s outputs as a CUDA graph holds them: one warm-up call on a side stream (compile, load modules, seed,
    all outside capture), step captured, then replayed on new values copied into the `inputs` it reads."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for t in inputs:
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("mod", ["causal", "alibi", "window"])
def test_ops_capture_in_a_cuda_graph(mod):
    """Capture, replay on new inputs (copied into the captured buffers), compare with an eager call of the provider
    each op picks when captured (the table's pick by GPU time, which may not be the eager pick)."""
    import generated.attention as att
    import generated.gemm as g

    x, w, bias = _randn(64, 4096), _randn(4096, 4096), _randn(4096)
    q, k, v = _randn(2, 32, 1, 128), _randn(2, 8, 4096, 128), _randn(2, 8, 4096, 128)

    def step():
        return g.linear(x, w, bias, "silu"), att.attention(q, k, v, mod=mod)

    y, o = _captured_and_replayed(step, (x, q, k, v))
    y_ref = g.run_provider(g.decide(x, w.t(), bias, "silu", captured=True), x, w.t(), bias, "silu")
    o_ref = att.run_provider(att.decide(q, k, v, mod=mod, captured=True), q, k, v, mod=mod)
    assert rel_err(y, y_ref.double()) < 1e-3 and rel_err(o, o_ref.double()) < 1e-3


def test_a_captured_call_runs_the_gpu_time_pick_built_inside_the_capture(monkeypatch):
    """Where a captured call picks another provider than an eager one (the table's graph_provider), the captured
    route is built on the first call inside the capture (module, kernels and launch plan made while the stream
    captures, after a warm-up that ran only the eager pick); the replay on new inputs equals that provider's eager
    call, and the eager call after it is the eager pick again."""
    import generated.attention as att
    import generated.gemm as g

    target = g._RT.device(0)[0]
    gemm_pick = "sm90_swap16" if target == "sm90" and "sm90_swap16" in g.SHIPPED else target
    if gemm_pick not in g.SHIPPED or "triton_splitkv" not in att.SHIPPED:
        pytest.skip("no Gluon GEMM or split-KV variant shipped for this device")
    for m, eager, captured in ((g, "torch", gemm_pick), (att, "sdpa", "triton_splitkv")):
        monkeypatch.setattr(m, "_ROUTES", {})
        monkeypatch.setattr(m, "_decide", lambda *a, captured=False, _e=eager, _c=captured, **kw: _c if captured else _e)
    monkeypatch.setattr(g, "_LINEAR_ROUTES", {})
    x, w = _randn(16, 4096), _randn(4096, 4096)
    q, k, v = _randn(8, 32, 1, 128), _randn(8, 8, 8192, 128), _randn(8, 8, 8192, 128)

    def step():
        return g.linear(x, w), att.attention(q, k, v, mod="causal")

    y, o = _captured_and_replayed(step, (x, q, k, v))
    assert torch.equal(y, g.run_provider(gemm_pick, x, w.t()))
    assert torch.equal(o, att.run_provider("triton_splitkv", q, k, v, mod="causal"))
    assert g.decide(x, w.t()) == "torch" and g.decide(x, w.t(), captured=True) == gemm_pick
    assert rel_err(step()[0], x.double() @ w.double().t()) < 1e-2


def test_linear_under_reduce_overhead_compile():
    import generated.gemm as g

    x, w = _randn(16, 4096), _randn(14336, 4096)
    f = torch.compile(lambda x: g.linear(x, w, None, "silu"), mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        out = f(x)
    assert rel_err(out, F.silu(x.double() @ w.double().t())) < 1e-2


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_a_training_step_through_linear_eager_and_compiled(out_dtype, monkeypatch):
    """An nn.Linear-style layer (Parameters that require grad) trained through `linear` where the table would pick
    our kernel: the step runs torch's autograd, eager and under torch.compile(fullgraph=True), and its gradients
    match float64; the op's own registered backward (torch.ops.gen.linear, our kernel forward) agrees."""
    import generated.gemm as g

    monkeypatch.setattr(g, "_ROUTES", {})
    monkeypatch.setattr(g, "_LINEAR_ROUTES", {})
    monkeypatch.setattr(g, "_decide", lambda *a, **kw: g._RT.device(0)[0])   # ours, as the table may pick at large M
    x = _randn(4, 512, 1024).requires_grad_()
    w = torch.nn.Parameter(_randn(2048, 1024) / 32)
    bias = torch.nn.Parameter(_randn(2048))
    grad = _randn(4, 512, 2048, dtype=out_dtype)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    want = torch.autograd.grad(F.silu(F.linear(x64, w64, b64)), (x64, w64, b64), grad.double())
    steps = {"eager": lambda: g.linear(x, w, bias, "silu", out_dtype),
             "compiled": torch.compile(lambda: g.linear(x, w, bias, "silu", out_dtype), fullgraph=True),
             "op": lambda: torch.ops.gen.linear(x, w, bias, "silu", out_dtype)}
    for name, step in steps.items():
        for _ in range(2):
            got = torch.autograd.grad(step(), (x, w, bias), grad)
        for a, b in zip(got, want):
            assert rel_err(a, b) < 2e-2, (name, out_dtype)


@pytest.mark.parametrize("provider", ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"])
def test_sdpa_providers_compute_our_semantics(provider):
    import generated.attention as att

    for lq, lk in ((1, 4096), (100, 1000), (512, 512)):
        q, k, v = _randn(2, 32, lq, 128), _randn(2, 8, lk, 128), _randn(2, 8, lk, 128)
        ref = att.run_provider("torch", q, k, v, mod="causal")
        try:
            out = att.run_provider(provider, q, k, v, mod="causal")
        except RuntimeError as e:   # a backend that does not take these inputs on this device
            pytest.skip(f"{provider}: {e}".splitlines()[0])
        assert rel_err(out, ref.double()) < 1e-2, (provider, lq, lk)


def _gluon_gemm_variants():
    """Every shipped Gluon GEMM module (the default configs and the named ones, e.g. sm90_swap16)."""
    import json
    from pathlib import Path

    manifest = json.loads((Path(__file__).resolve().parents[1] / "generated" / "gemm" / "manifest.json").read_text())
    return [v.get("name", v["target"]) for v in manifest["variants"] if v["target"] in ("sm90", "sm100")]


@pytest.mark.parametrize("provider", _gluon_gemm_variants())
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (5, 136, 72), (16, 1000, 520), (64, 520, 320), (300, 264, 136)])
def test_every_shipped_config_matches_float64(provider, layout, m, n, k):
    """Each named config (swap-AB included: an [N, K] weight on the wgmma's 64-row side) on decode, odd and tail
    shapes, both weight layouts, bias and an activation; fresh inputs on the second call."""
    import generated.gemm as g
    from generated._runtime.dispatch import variant_target

    if g._RT.device(0)[0] != variant_target(provider):
        pytest.skip(f"{provider} does not run here")
    w, bias = _randn(n, k), _randn(n)
    b = w.t() if layout == "nk" else w.t().contiguous()
    for _ in range(2):
        x = _randn(m, k)
        out = g.run_provider(provider, x, b, bias, "gelu_tanh")
        ref = F.gelu(x.double() @ b.double() + bias.double(), approximate="tanh")
        assert torch.isfinite(out).all() and rel_err(out, ref) < 1e-2, (provider, layout, m, n, k)


@pytest.mark.parametrize("provider", _gluon_gemm_variants() + ["triton", "triton_splitk", "torch"])
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("m, n, k", [(1, 14336, 4096), (5, 136, 72), (16, 1000, 520), (300, 264, 136)])
def test_gated_gemm_matches_float64_on_every_provider(provider, activation, m, n, k):
    """A gated activation (one fused [2N, K] gate_up weight, gate rows first) on every variant that runs here: the
    output act(gate) * up against float64 on decode, odd and tail shapes, with bias, both weight layouts; the op's
    `linear` on the same call; a CUDA-graph capture replayed on new inputs."""
    import generated.gemm as g
    from generated._runtime.dispatch import variant_target

    if provider not in g.PROVIDERS:
        pytest.skip(f"{provider} not shipped")
    if variant_target(provider) in ("sm90", "sm100") and g._RT.device(0)[0] != variant_target(provider):
        pytest.skip(f"{provider} does not run here")
    act = F.silu if activation == "swiglu" else (lambda t: F.gelu(t, approximate="tanh"))
    w, bias = _randn(2 * n, k), _randn(2 * n)
    for b in (w.t(), w.t().contiguous()):
        x = _randn(m, k)
        z = x.double() @ b.double() + bias.double()
        out = g.run_provider(provider, x, b, bias, activation)
        assert out.shape == (m, n) and rel_err(out, act(z[:, :n]) * z[:, n:]) < 1e-2, (provider, m, n, k)
    y = g.linear(x, w, bias, activation=activation)
    assert rel_err(y, act(z[:, :n]) * z[:, n:]) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g.run_provider(provider, x, w.t(), bias, activation)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, g.run_provider(provider, x, w.t(), bias, activation))


@pytest.mark.parametrize("provider", _gluon_gemm_variants() + ["triton", "triton_splitk", "torch"])
@pytest.mark.parametrize("activation, out_dtype", [("none", torch.bfloat16), ("none", torch.float32),
                                                   ("silu", torch.bfloat16), ("swiglu", torch.bfloat16)])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (5, 136, 72), (16, 1000, 520), (300, 4096, 4096)])
def test_residual_gemm_matches_float64_on_every_provider(provider, activation, out_dtype, m, n, k):
    """act(x @ W^T + b) + residual on every variant that runs here (sm90's swapped, split-K and unswapped epilogues
    each read it): decode, odd and tail shapes, with bias, both weight layouts, the residual a row view of a wider
    buffer (as a model's hidden state may be) and contiguous; the op's `linear` on the same call; a CUDA-graph capture
    replayed on a new residual."""
    import generated.gemm as g
    from generated._runtime.dispatch import variant_target

    if provider not in g.PROVIDERS:
        pytest.skip(f"{provider} not shipped")
    if variant_target(provider) in ("sm90", "sm100") and g._RT.device(0)[0] != variant_target(provider):
        pytest.skip(f"{provider} does not run here")
    nb = 2 * n if activation == "swiglu" else n
    w, bias = _randn(nb, k), _randn(nb)

    def reference(x, b, r):
        z = x.double() @ b.double() + bias.double()
        y = {"none": z, "silu": F.silu(z), "swiglu": F.silu(z[:, :n]) * z[:, n:] if nb > n else None}[activation]
        return y + r.double()

    wide = torch.randn(m, n + 64, device="cuda").to(out_dtype)
    for b in (w.t(), w.t().contiguous()):
        for r in (wide[:, 32:32 + n], wide[:, :n].contiguous()):
            x = _randn(m, k)
            out = g.run_provider(provider, x, b, bias, activation, out_dtype, residual=r)
            assert out.shape == (m, n) and out.dtype == out_dtype, provider
            assert rel_err(out, reference(x, b, r)) < 1e-2, (provider, m, n, k, r.is_contiguous())
    y = g.linear(x, w, bias, activation=activation, out_dtype=out_dtype, residual=r)
    assert rel_err(y, reference(x, w.t(), r)) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g.run_provider(provider, x, w.t(), bias, activation, out_dtype, residual=r)
    r.copy_(torch.randn_like(r))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, g.run_provider(provider, x, w.t(), bias, activation, out_dtype, residual=r))


@pytest.mark.parametrize("provider", _gluon_gemm_variants() + ["triton", "triton_splitk", "torch"])
@pytest.mark.parametrize("activation, out_dtype, residual", [("none", torch.bfloat16, False),
                                                             ("swiglu", torch.bfloat16, False),
                                                             ("none", torch.float32, True)])
@pytest.mark.parametrize("m, n, k", [(1, 6144, 4096), (5, 136, 72), (16, 1000, 520), (300, 4096, 4096)])
def test_rms_rows_gemm_matches_float64_on_every_provider(provider, activation, out_dtype, residual, m, n, k):
    """act(rmsnorm(x) @ W^T + b) [+ r] with the norm's gain folded into W (rms_eps) on every variant that runs here
    (sm90's swapped epilogue scales columns, split-K's reduce kernel rows): x's rows at sizes 0.125-8, decode, odd and
    tail shapes, with bias, both weight layouts; the op's `linear` on the same call; a CUDA-graph capture replayed on
    a new x (its norms are computed inside the graph)."""
    import generated.gemm as g
    from generated._runtime.dispatch import variant_target

    if provider not in g.PROVIDERS:
        pytest.skip(f"{provider} not shipped")
    if variant_target(provider) in ("sm90", "sm100") and g._RT.device(0)[0] != variant_target(provider):
        pytest.skip(f"{provider} does not run here")
    eps, nb = 1e-5, 2 * n if activation == "swiglu" else n
    gain = 1 + 0.3 * torch.randn(k, device="cuda")
    w, bias = _randn(nb, k), _randn(nb)
    wf = g.fold_rms_gain(w, gain.bfloat16())
    r = torch.randn(m, n, device="cuda").to(out_dtype) if residual else None

    def new_x():
        return (torch.randn(m, k, device="cuda") * (torch.rand(m, 1, device="cuda") * 8 + 0.125)).bfloat16()

    def reference(x):
        xd = x.double()
        z = (xd * (xd.square().mean(-1, keepdim=True) + eps).rsqrt() * gain.bfloat16().double()) @ w.double().t()
        z = z + bias.double()
        y = z if activation == "none" else F.silu(z[:, :n]) * z[:, n:]
        return y if r is None else y + r.double()

    for b in (wf.t(), wf.t().contiguous()):
        x = new_x()
        out = g.run_provider(provider, x, b, bias, activation, out_dtype, residual=r, rms_eps=eps)
        assert out.shape == (m, n) and out.dtype == out_dtype, provider
        assert rel_err(out, reference(x)) < 1.5e-2, (provider, m, n, k, b.is_contiguous())
    y = g.linear(x, wf, bias, activation=activation, out_dtype=out_dtype, residual=r, rms_eps=eps)
    assert rel_err(y, reference(x)) < 1.5e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g.run_provider(provider, x, wf.t(), bias, activation, out_dtype, residual=r, rms_eps=eps)
    x.copy_(new_x())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, g.run_provider(provider, x, wf.t(), bias, activation, out_dtype, residual=r,
                                                rms_eps=eps))


def _rope_module_or_skip(provider: str, d: int, interleaved: bool):
    """generated.gemm, where `provider` is shipped, runs on this GPU and rotates (d, interleaved); else a skip."""
    import generated.gemm as g
    from generated._runtime.dispatch import variant_target

    if provider not in g.PROVIDERS:
        pytest.skip(f"{provider} not shipped")
    if variant_target(provider) in ("sm90", "sm100") and g._RT.device(0)[0] != variant_target(provider):
        pytest.skip(f"{provider} does not run here")
    if provider != "torch" and (d, interleaved) not in g._RT.module_attr(provider, "ROPE_KINDS", ()):
        pytest.skip(f"{provider} does not rotate ({d}, interleaved={interleaved})")
    return g


def _rope_tables(positions, d: int, interleaved: bool):
    """A rotary embedding's bf16 (cos, sin) [len(positions), d] (Llama-3's base 500000)."""
    angles = positions.double()[:, None] * 500000.0 ** (-torch.arange(0, d, 2, device="cuda").double() / d)
    full = angles.repeat_interleave(2, -1) if interleaved else torch.cat((angles, angles), -1)
    return full.cos().bfloat16(), full.sin().bfloat16()


def _rotated_reference(z, cos, sin, cols: int, d: int, interleaved: bool):
    """z [M, N] (float64) with its first cols columns rotated head by head (the rows' tables), the rest kept."""
    h = z[:, :cols].unflatten(-1, (cols // d, d))
    if interleaved:
        partner = torch.stack((-h[..., 1::2], h[..., 0::2]), dim=-1).flatten(-2)
    else:
        partner = torch.cat((-h[..., d // 2:], h[..., :d // 2]), dim=-1)
    rot = h * cos.double()[:, None] + partner * sin.double()[:, None]
    return torch.cat((rot.flatten(1), z[:, cols:]), dim=1)


@pytest.mark.parametrize("provider", _gluon_gemm_variants() + ["triton", "triton_splitk", "torch"])
@pytest.mark.parametrize("d, interleaved", [(128, False), (64, False), (128, True)])
@pytest.mark.parametrize("m, heads, kv_heads, k", [(1, 32, 8, 4096), (5, 3, 1, 72), (300, 4, 2, 136),
                                                  (2048, 32, 8, 4096)])
def test_rope_gemm_matches_float64_on_every_provider(provider, d, interleaved, m, heads, kv_heads, k):
    """A QKV projection with RoPE on its q and k heads (rope=(cos, sin), rope_columns=(H + Hkv) * D) on every variant
    whose ROPE_KINDS has this head dim and convention: against float64 (F.linear, then the rotation of those
    columns, v's left alone), decode, odd and tail shapes, both weight layouts; the op's `linear` on [B, L, K] with
    [1, L, D] tables; a CUDA-graph capture replayed on new positions."""
    g = _rope_module_or_skip(provider, d, interleaved)
    cols, n = (heads + kv_heads) * d, (heads + 2 * kv_heads) * d
    w, bias = _randn(n, k), _randn(n)

    def tables(positions):
        return _rope_tables(positions, d, interleaved)

    def reference(x, cos, sin):
        return _rotated_reference(x.double() @ w.double().t() + bias.double(), cos, sin, cols, d, interleaved)

    kw = dict(rope_columns=cols, rope_interleaved=interleaved)
    for b in (w.t(), w.t().contiguous()):
        x = _randn(m, k)
        cos, sin = tables(torch.randint(0, 8192, (m,), device="cuda"))
        out = g.run_provider(provider, x, b, bias, rope=(cos, sin), **kw)
        assert out.shape == (m, n) and torch.isfinite(out).all(), provider
        assert rel_err(out, reference(x, cos, sin)) < 1e-2, (provider, d, interleaved, m, b.is_contiguous())
    lq = max(1, m // 2) if m % 2 == 0 else m
    x3 = _randn(m // lq, lq, k)
    cos, sin = tables(torch.arange(lq, device="cuda"))
    y = g.linear(x3, w, bias, rope=(cos[None], sin[None]), **kw)
    ref = reference(x3.reshape(m, k), cos.repeat(m // lq, 1), sin.repeat(m // lq, 1))
    assert rel_err(y.reshape(m, n), ref) < 1e-2
    cos_s, sin_s = tables(torch.zeros(m, device="cuda"))   # the graph's tables, refilled before its replay
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g.run_provider(provider, x, w.t(), bias, rope=(cos_s, sin_s), **kw)
    new_cos, new_sin = tables(torch.randint(0, 8192, (m,), device="cuda"))
    cos_s.copy_(new_cos)
    sin_s.copy_(new_sin)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(captured, reference(x, new_cos, new_sin)) < 1e-2


@pytest.mark.parametrize("provider", _gluon_gemm_variants() + ["triton", "triton_splitk", "torch"])
@pytest.mark.parametrize("d, interleaved", [(128, False), (64, False), (64, True)])
@pytest.mark.parametrize("m, heads, kv_heads, k", [(1, 32, 8, 4096), (300, 4, 2, 136)])
def test_rms_rope_gemm_matches_float64_on_every_provider(provider, d, interleaved, m, heads, kv_heads, k):
    """A pre-norm model's QKV projection in one call, as gen's decoder block makes it: RMSNorm rows (rms_eps) and
    RoPE on the q and k heads, against float64 (x / rms(x), F.linear, the rotation), on every variant that claims the
    RoPE kind; then as linear on [B, L, K] with [1, L, D] tables."""
    g = _rope_module_or_skip(provider, d, interleaved)
    cols, n, eps = (heads + kv_heads) * d, (heads + 2 * kv_heads) * d, 1e-5
    w, bias, x = _randn(n, k), _randn(n), _randn(m, k) * 3
    cos, sin = _rope_tables(torch.randint(0, 8192, (m,), device="cuda"), d, interleaved)
    xd = x.double()
    z = (xd * (xd.square().mean(-1, keepdim=True) + eps).rsqrt()) @ w.double().t() + bias.double()
    ref = _rotated_reference(z, cos, sin, cols, d, interleaved)
    kw = dict(rms_eps=eps, rope_columns=cols, rope_interleaved=interleaved)
    out = g.run_provider(provider, x, w.t(), bias, rope=(cos, sin), **kw)
    assert out.shape == (m, n) and rel_err(out, ref) < 1e-2, (provider, d, interleaved, m)
    y = g.linear(x[None], w, bias, rope=(cos[None], sin[None]), **kw)
    assert rel_err(y[0], ref) < 1e-2


@pytest.mark.parametrize("provider", ["triton_splitk", "sm90_splitk"])
@pytest.mark.parametrize("m, n, k", [(1, 4096, 14336), (16, 4096, 14336), (7, 1024, 4104), (64, 14336, 4096),
                                     (2048, 4096, 4096), (1576, 768, 3072)])
def test_split_k_gemm_matches_float64_is_deterministic_and_captures(provider, m, n, k):
    """A split-K variant as the op launches it (decode M against the down projection's K: K sliced; a K tail; large
    M: no split, or 1-2 slices; a ViT N 768 layer), an nn.Linear weight, bias and SiLU, against the float64 math;
    the same bits on a second run (slices are summed in a fixed order); then captured in a CUDA graph and replayed on
    new inputs."""
    import generated.gemm as g

    if provider not in g.PROVIDERS:
        pytest.skip(f"{provider} not shipped")
    if provider.startswith("sm90") and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm90 variants run on Hopper")
    x, w, bias = _randn(m, k), _randn(n, k), _randn(n)
    out = g.run_provider(provider, x, w.t(), bias, "silu")
    assert rel_err(out, F.silu(x.double() @ w.double().t() + bias.double())) < 1e-2, (m, n, k)
    assert torch.equal(out, g.run_provider(provider, x, w.t(), bias, "silu"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g.run_provider(provider, x, w.t(), bias, "silu")
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, g.run_provider(provider, x, w.t(), bias, "silu"))


def _split_kv_providers() -> list:
    """Every shipped split-KV config: triton_splitkv and the tuned ones (specs/tuned/attention.yaml), found as the
    suite runner finds them."""
    import generated.attention as att
    from bench.suite.run import _split_kv

    return [n for n in att.SHIPPED if _split_kv(n)]


@pytest.mark.parametrize("provider", _split_kv_providers())
@pytest.mark.parametrize("mod", ["causal", "softcap", "alibi", "window", "decay"])
@pytest.mark.parametrize("b, hq, hkv, lq, lk", [(1, 32, 8, 1, 8192), (8, 32, 8, 4, 4097), (2, 64, 8, 16, 1000),
                                                (64, 28, 4, 1, 300), (1, 8, 8, 7, 5)])
def test_split_kv_decode_matches_float64_and_captures(provider, mod, b, hq, hkv, lq, lk):
    """A split-KV variant as the op launches it (several splits and a combine on the long caches, one split on the
    big batch, fully masked rows at Lq > Lk), q a [B, L, H, D] projection view, against the float64 math; then the
    same call captured in a CUDA graph and replayed on new inputs."""
    import generated.attention as att

    q = _randn(b, lq, hq, 128).transpose(1, 2)
    k, v = _randn(b, hkv, lk, 128), _randn(b, hkv, lk, 128)
    out, lse = att.run_provider(provider, q, k, v, mod=mod, return_lse=True)
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, None, None)
    slopes = att.default_alibi_slopes(hq, q.device) if mod == "alibi" else None
    ref, ref_lse = att.torch_math(q.double(), k.double(), v.double(), scale, mod, left, right, cap, slopes)
    assert rel_err(out, ref) < 1e-2, (mod, b, hq, hkv, lq, lk)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max() < 1e-2

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = att.run_provider(provider, q, k, v, mod=mod)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, att.run_provider(provider, q, k, v, mod=mod))


def _attention_grads(att, q, k, v, mod, g, compiled=False):
    """(dq, dk, dv) of sum(attention(q, k, v) * g), eager or under torch.compile(fullgraph=True)."""
    def loss(q, k, v):
        return (att.attention(q, k, v, mod=mod).float() * g).sum()
    if compiled:
        torch._dynamo.reset()   # `loss` is one code object across the cases: each would be a recompile, and fullgraph
        fn = torch.compile(loss, fullgraph=True)   # fails at the recompile limit, not on the op
    else:
        fn = loss
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fn(q, k, v).backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("mod", ["causal", "softcap", "alibi", "window", "decay"])
@pytest.mark.parametrize("b, hq, hkv, lq, lk", [(2, 8, 2, 300, 300), (1, 4, 4, 1, 500), (1, 8, 2, 100, 333)])
def test_attention_backward_matches_fp32_autograd_on_the_gpu(mod, b, hq, hkv, lq, lk):
    """A training call's gradients against autograd of the fp32 math, eager and under torch.compile(fullgraph=True):
    SDPA's backward where SDPA expresses the mod (causal at Lq == Lk or Lq == 1), else the portable Triton backward
    (any forward provider), which gives the same bits twice (no atomics)."""
    import generated.attention as att

    q, k, v = _randn(b, hq, lq, 128), _randn(b, hkv, lk, 128), _randn(b, hkv, lk, 128)
    g = torch.randn(b, hq, lq, 128, device="cuda")
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, None, None)
    ours = att._training_sdpa_plan(q, k, mod, scale) is None
    assert ours == (mod != "causal" or lq not in (1, lk)), (mod, lq, lk)
    got = _attention_grads(att, q, k, v, mod, g)
    if ours:
        assert all(torch.equal(a, c) for a, c in zip(got, _attention_grads(att, q, k, v, mod, g)))
    slopes = att.default_alibi_slopes(hq, q.device) if mod == "alibi" else None
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    ref = att.torch_math(qf, kf, vf, scale, mod, left, right, cap, slopes)[0].float()
    want = torch.autograd.grad((ref * g).sum(), (qf, kf, vf))
    for a, w in zip(got, want):
        assert rel_err(a, w.double()) < 2e-2, (mod, b, hq, hkv, lq, lk)
    for a, w in zip(_attention_grads(att, q, k, v, mod, g, compiled=True), want):
        assert rel_err(a, w.double()) < 2e-2, ("compiled", mod, b, hq, hkv, lq, lk)


@pytest.mark.parametrize("mod", ["none", "causal", "softcap", "alibi", "window", "decay"])
@pytest.mark.parametrize("b, hq, hkv, lq, lk, d", [(2, 8, 2, 300, 300, 128), (1, 4, 4, 1, 500, 64),
                                                  (1, 8, 2, 100, 333, 128), (2, 4, 2, 257, 129, 64)])
def test_gluon_backward_kernels_match_fp32_autograd_on_the_gpu(monkeypatch, mod, b, hq, hkv, lq, lk, d):
    """The device target's Gluon backward kernels (sm90) inside our backward, through the registered op (our forward,
    so SDPA's backward never stands in): the dK/dV kernel (GEN_ATTENTION_BACKWARD=gluon) and the dQ kernel too
    (gluon-dq, the default): gradients against autograd of the fp32 math, the same bits twice; with gluon, dQ (the
    portable kernel) equal to the portable backward's; with gluon-dq, dK and dV equal to gluon's."""
    import generated.attention as att

    q, k, v = _randn(b, hq, lq, d), _randn(b, hkv, lk, d), _randn(b, hkv, lk, d)
    monkeypatch.setattr(att, "BACKWARD", "gluon")
    if att._gluon_backward_module(q, mod) is None:
        pytest.skip("this GPU's target has no Gluon backward kernels")
    g = torch.randn(b, hq, lq, d, device="cuda")
    _, _, _, scale, _, left, right, cap, _ = att._arguments(q, k, v, mod, None, None, None, None)
    slopes = att.default_alibi_slopes(hq, q.device) if mod == "alibi" else None

    def grads(kernels):
        monkeypatch.setattr(att, "BACKWARD", kernels)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = att._op(*leaves, scale, mod, left, right, cap, slopes, True)[0]
        return torch.autograd.grad((out.float() * g).sum(), leaves)

    got, with_dq, portable = grads("gluon"), grads("gluon-dq"), grads("triton")
    assert all(torch.equal(a, c) for a, c in zip(got, grads("gluon")))
    assert all(torch.equal(a, c) for a, c in zip(with_dq, grads("gluon-dq")))
    assert torch.equal(got[0], portable[0])
    assert torch.equal(with_dq[1], got[1]) and torch.equal(with_dq[2], got[2])
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    ref = att.torch_math(qf, kf, vf, scale, mod, left, right, cap, slopes)[0].float()
    want = torch.autograd.grad((ref * g).sum(), (qf, kf, vf))
    for a, w in zip(got + with_dq[:1], want + want[:1]):
        assert rel_err(a, w.double()) < 2e-2, (mod, b, hq, hkv, lq, lk, d)


@pytest.mark.parametrize("mod", ["none", "causal"])
def test_a_growing_kv_cache_leaves_providers_that_set_up_per_length(mod):
    """A decode step over a growing cache (one key more each call, views of one buffer): the first length takes the
    table's pick; from the second on, the bucket's best provider without a per-length setup (not SDPA's own choice
    or cuDNN), with the same answer as the math."""
    import generated.attention as att

    q = _randn(2, 32, 1, 128)
    cache = _randn(2, 2, 8, 4200, 128)
    att._SEEN_LENGTHS.clear()
    picked = []
    for n in (4096, 4097, 4098):
        k, v = cache[0, :, :, :n], cache[1, :, :, :n]
        out = att.attention(q, k, v, mod=mod)
        picked.append(att._route(q, k, v, mod, None, None, None, None, False).provider)
        ref, _ = att.torch_math(q.double(), k.double(), v.double(), 128 ** -0.5, mod, 0, 0, 0.0, None)
        assert rel_err(out, ref) < 1e-2, (mod, n, picked)
    assert not set(picked[1:]) & {"sdpa", "sdpa-cudnn"}, picked
