"""The attention mod IR (gen/families/mod_ir.py): every lowering computes the same mod, on random inputs.

For the shipped mods and FlexAttention-style custom ones: the torch reference (`Mod.apply`), FlexAttention's
score_mod / mask_mod (called as flex calls them, vmapped over b, h, q_idx, kv_idx), the eager path as the api
template renders it, and the kernels' text (run on torch through a stand-in `tl`) agree; the derivative matches
torch.autograd in float64; bad expressions are SpecErrors naming their field.
"""
from __future__ import annotations

import ast
import types

import pytest
import torch
import yaml
from torch.nn.attention.flex_attention import _vmap_for_bhqkv

from gen.families import mod_ir
from gen.families.attention import alibi_slopes, reference
from gen.build.render import render_api
from gen.build.spec import SpecError, load_spec

from .conftest import ROOT

CUSTOM = {
    "twice": "score * 2",
    "squared": "score * score",
    "head_offset": "score + h",
    "relative": "score + 0.01 * (kv_idx - q_idx)",
    "where_mask": "where(kv_idx <= q_idx, score, -10000.0)",
    "smooth": "tanh(score) * exp(-abs(score)) + sqrt(abs(score) + 1) - log(abs(score) + 2)",
    "clamped": "minimum(score, maximum(score * 0.5, score - 1)) / (1 + abs(score))",
    "gated": "score * (b + 1) - (score > 0) * score",
    "capped": "minimum(score, 3.0) + maximum(-2.0, score)",   # numbers as minimum/maximum arguments
}
B, H = 2, 3
PARAMS = {"window_left": 3, "window_right": 1, "softcap": 2.5}


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    """The shipped attention spec plus the custom mods (one of them under a window mask)."""
    raw = yaml.safe_load((ROOT / "specs" / "attention.yaml").read_text())
    raw["options"]["mods"] += [{"name": n, "score_mod": "custom", "expr": e} for n, e in CUSTOM.items()]
    raw["options"]["mods"].append({"name": "window_twice", "mask": "window", "left": 3, "right": 1,
                                   "score_mod": "custom", "expr": "score * 2"})
    path = tmp_path_factory.mktemp("modir") / "attention.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


MOD_NAMES = ["none", "causal", "window", "softcap", "alibi", "decay", *CUSTOM, "window_twice"]


@pytest.fixture(scope="module")
def eager(spec):
    """The `_mod_*` functions of the api template rendered for `spec` (what generated/attention/__init__.py holds)."""
    text = render_api(spec, {"spec": spec, "options": spec.options, "shipped": [],
                             "manifest": {"spec": {"path": "attention.yaml", "sha256": "0" * 64}, "variants": []}})
    wanted = [n for n in ast.parse(text).body
              if (isinstance(n, ast.FunctionDef) and n.name.startswith(("_mod_", "_sm_")))
              or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]).lstrip("(").startswith(("_sm_", "_MOD_MATH")))]
    scope = {"torch": torch}
    exec(compile(ast.Module(wanted, []), "api", "exec"), scope)
    return scope["_MOD_MATH"]


def env_for(lq: int, lk: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"score": 4 * torch.randn(B, H, lq, lk, dtype=torch.float64, generator=g),
            "b": torch.arange(B).view(B, 1, 1, 1), "h": torch.arange(H).view(1, H, 1, 1),
            "q_idx": torch.arange(lq).view(lq, 1), "kv_idx": torch.arange(lk).view(1, lk), "Lq": lq, "Lk": lk,
            "alibi_slopes": 0.1 + torch.rand(H, dtype=torch.float64, generator=g), **PARAMS}


LENGTHS = [(5, 9, 0), (9, 5, 1), (1, 6, 2)]  # Lq < Lk, Lq > Lk (rows with no key), decode


@pytest.mark.parametrize("lq,lk,seed", LENGTHS)
@pytest.mark.parametrize("name", MOD_NAMES)
def test_flex_score_and_mask_mods_match_the_reference(spec, name, lq, lk, seed):
    mod = mod_ir.of(next(m for m in spec.options["mods"] if m["name"] == name))
    env = env_for(lq, lk, seed)
    ref = mod.apply(env)
    score_mod, mask_mod = mod_ir.flex_mods(mod, torch.tensor(lq), torch.tensor(lk), alibi_slopes=env["alibi_slopes"],
                                           **PARAMS)
    idx = (torch.arange(B), torch.arange(H), torch.arange(lq), torch.arange(lk))
    s = env["score"] if score_mod is None else _vmap_for_bhqkv(score_mod, prefix=(0,))(env["score"], *idx)
    if mask_mod is not None:
        s = s.masked_fill(~_vmap_for_bhqkv(mask_mod, prefix=())(*idx), float("-inf"))
    torch.testing.assert_close(s, ref.expand_as(s), rtol=1e-12, atol=1e-12)
    assert (score_mod is None) == (mod.score is None) and (mask_mod is None) == (mod.keep is None)


@pytest.mark.parametrize("lq,lk,seed", LENGTHS)
@pytest.mark.parametrize("name", MOD_NAMES)
def test_eager_path_and_kernel_text_match_the_reference(spec, eager, name, lq, lk, seed):
    mod = mod_ir.of(next(m for m in spec.options["mods"] if m["name"] == name))
    env = env_for(lq, lk, seed)
    ref = mod.apply(env)
    args = [env[k] for k in ("score", "b", "h", "q_idx", "kv_idx", "Lq", "Lk", "window_left", "window_right",
                             "softcap", "alibi_slopes")]
    torch.testing.assert_close(eager[name](*args), ref, rtol=0, atol=0)

    # the kernels' statements, on torch: tl.load(alibi_ptr + h) reads slope h, the fp32 cast keeps float64 here
    class Slopes:
        def __add__(self, h):
            return env["alibi_slopes"][h]
    tl = types.SimpleNamespace(load=lambda x: x, where=torch.where, float32=torch.float64)
    helpers = {f"_sm_{f}": fn for f, fn in mod_ir._torch_calls().items()}
    scope = {**env, **helpers, "tl": tl, "alibi_ptr": Slopes()}
    for line in mod.score_lines("tl") + mod.mask_lines("tl"):
        exec(line, scope)
    torch.testing.assert_close(scope["score"], ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", MOD_NAMES)
def test_derivative_matches_autograd(spec, name):
    mod = mod_ir.of(next(m for m in spec.options["mods"] if m["name"] == name))
    env = env_for(6, 8, 3)
    score = env["score"].requires_grad_()
    out = mod.modded(env)
    (expected,) = torch.autograd.grad(out.sum(), score) if out.requires_grad else (torch.zeros_like(score),)
    got = torch.as_tensor(mod.grad(env), dtype=torch.float64).expand_as(score)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    mod_ir.source(mod.dscore, "tl")  # and the derivative lowers to kernel text like the mod itself


def test_derivatives_of_the_builtin_mods(spec):
    env = env_for(4, 4, 4)
    s = env["score"]
    softcap = mod_ir.of({"name": "s", "mask": "none", "score_mod": "softcap", "expr": None})
    torch.testing.assert_close(softcap.grad(env), 1 - torch.tanh(s / PARAMS["softcap"]) ** 2)
    for m in ("none", "causal", "window", "alibi"):
        assert mod_ir.of(next(x for x in spec.options["mods"] if x["name"] == m)).dscore == mod_ir.ONE


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_computes_the_reference(spec):
    """End to end: FlexAttention with the IR's score_mod / block mask against the float64 reference."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(5)
    lq, lk = 12, 20
    q, k, v = (torch.randn(1, 4, n, 16, generator=g) for n in (lq, lk, lk))
    slopes = alibi_slopes(4)
    for name in MOD_NAMES:
        mod = mod_ir.of(next(m for m in spec.options["mods"] if m["name"] == name))
        score_mod, mask_mod = mod_ir.flex_mods(mod, lq, lk, alibi_slopes=slopes, **PARAMS)
        block_mask = create_block_mask(mask_mod, None, None, lq, lk, device="cpu") if mask_mod else None
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=0.25)
        ref, _ = reference({"q": q, "k": k, "v": v, "mod": name, "scale": 0.25, "window_left": 3, "window_right": 1,
                            "softcap": 2.5, "alibi_slopes": slopes}, spec.options)
        torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5, msg=name)


def test_kernel_text_of_the_shipped_mods():
    """What the templates splice in (byte-identical to the kernels before the IR)."""
    shipped = {m["name"]: mod_ir.of(m) for m in load_spec(ROOT / "specs" / "attention.yaml").options["mods"]}
    assert shipped["softcap"].score_lines("gl") == ["score = softcap * _sm_tanh(score / softcap)"]
    assert shipped["alibi"].score_lines("tl") == [
        "slope = tl.load(alibi_ptr + h)", "score = score + slope * (kv_idx - (q_idx + (Lk - Lq))).to(tl.float32)"]
    assert shipped["decay"].score_lines("gl") == ["score = (score - 0.05 * _sm_abs(q_idx - kv_idx)).to(gl.float32)"]
    assert shipped["window"].mask_lines("gl") == [
        "diag = q_idx + (Lk - Lq)", "keep = (kv_idx <= diag + window_right) & (kv_idx >= diag - window_left) & "
        "(kv_idx < Lk)", 'score = gl.where(keep, score, -float("inf"))']
    assert shipped["none"].mask_lines("tl") == ['score = tl.where(kv_idx < Lk, score, -float("inf"))']


def test_slope_loaded_by_the_caller_lowers_to_the_passed_value():
    """sm100's SLOPE_PER_TILE: the kernel loads the slope once per tile and passes its value where the helpers take
    the pointer, so the slope's let-binding reads `alibi_ptr` itself and nothing else of the lowering changes."""
    shipped = {m["name"]: mod_ir.of(m) for m in load_spec(ROOT / "specs" / "attention.yaml").options["mods"]}
    assert [n for n, m in shipped.items() if m.reads_slope] == ["alibi"]
    alibi = shipped["alibi"]
    loaded, loading = alibi.score_lines("gl", slope_loaded=True), alibi.score_lines("gl")
    assert loaded[0] == "slope = alibi_ptr" and loading[0] == "slope = gl.load(alibi_ptr + h)"
    assert loaded[1:] == loading[1:]
    for name, m in shipped.items():   # mods without a slope lower the same either way
        if name != "alibi":
            assert m.score_lines("gl", slope_loaded=True) == m.score_lines("gl")
            assert m.dscore_lines("gl", slope_loaded=True) == m.dscore_lines("gl")
    # the sm100 template's 3.7 config renders exactly this: no per-chunk load of the slopes left in the helpers
    golden = (ROOT / "tests" / "golden" / "attention" / "sm100.EPI_D=16.SLOPE_PER_TILE=True.WORKER_REGS=48.py")
    text = golden.read_text()
    assert "gl.load(alibi_ptr + h)" not in text.split("def _softmax_partition")[0]
    assert "slope = alibi_ptr" in text


def test_stored_text_longer_than_the_limit_still_lowers():
    """The spec stores the unparsed expression, which can outgrow EXPR_MAX_CHARS (spaces around operators)."""
    expr = "+".join(["score*h*b*q_idx*kv_idx*2"] * 8)
    expr = f"({expr})-({expr})"
    assert len(expr) <= mod_ir.EXPR_MAX_CHARS
    stored = mod_ir.safe_score_expr(expr, "spec.yaml", "options.mods[0].expr")
    assert len(stored) > mod_ir.EXPR_MAX_CHARS
    mod = mod_ir.of({"name": "long", "mask": "none", "score_mod": "custom", "expr": stored})
    assert mod.score == mod_ir.Float(mod_ir.parse_expr(expr, "spec.yaml", "f"))


@pytest.mark.parametrize("expr, problem", [
    ("__import__('os').system('x')", "not allowed"),
    ("score.real", "not allowed"),
    ("score ** 2", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("score if h else 0", "not allowed"),
    ("score + secret", "unknown name 'secret'"),
    ("_sm_abs(score)", "not allowed"),
    ("exp + score", "used as a value"),
    ("where(score)", "takes 3 argument(s)"),
    ("score + 'a'", "not a number"),
    ("score + True", "not a number"),
    ("q_idx < kv_idx < score", "chained comparison"),
    ("score +", "not a Python expression"),
    ("", "missing or empty"),
])
def test_bad_expressions_are_spec_errors_naming_the_field(tmp_path, expr, problem):
    with pytest.raises(SpecError) as info:
        mod_ir.parse_expr(expr, "spec.yaml", "options.mods[2].expr")
    assert info.value.field == "options.mods[2].expr" and problem in info.value.problem
    raw = yaml.safe_load((ROOT / "specs" / "attention.yaml").read_text())
    raw["options"]["mods"][5]["expr"] = expr
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "a.yaml")
    assert info.value.field == "options.mods[5].expr" and problem in info.value.problem
