"""One op, one family: the stages hold no per-family branches, every family implements the whole Family protocol,
and the protocol functions the stages call do what the stages relied on (cases, outputs, launch order, judgement)."""
import ast
import math
import types
from pathlib import Path

import pytest
import torch

from gen.families import FAMILIES, get_family
from gen.families.protocol import MEMBERS, check_family
from gen.build.spec import SpecError, load_spec
from gen.measure.verify import verify_module

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "gen"


# ---- (a) no family branches outside gen/families/ ----

def _names_a_family(node: ast.AST) -> bool:
    """A family name ("gemm") or a collection of them."""
    if isinstance(node, ast.Constant):
        return node.value in FAMILIES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_family(e) for e in node.elts)
    return False


def _is_family_branch(compare: ast.Compare) -> bool:
    """Against a family name; on `x.family`; or `family` against any string (a family that does not exist yet)."""
    operands = [compare.left, *compare.comparators]
    if any(map(_names_a_family, operands)) or any(isinstance(o, ast.Attribute) and o.attr == "family" for o in operands):
        return True
    return (any(isinstance(o, ast.Name) and o.id == "family" for o in operands)
            and any(isinstance(o, ast.Constant) and isinstance(o.value, str) for o in operands))


def family_branches(source: str, filename: str) -> list[str]:
    """filename:line of every comparison that branches on a family, every match on a family name, and every dict
    keyed by family names (a lookup table is a branch too)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare) and _is_family_branch(node):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchValue) and _names_a_family(node.value):
            found.append(f"{filename}:{node.lineno}: case {ast.unparse(node.value)}")
        elif isinstance(node, ast.Dict) and any(k is not None and _names_a_family(k) for k in node.keys):
            found.append(f"{filename}:{node.lineno}: {{{', '.join(ast.unparse(k) for k in node.keys if k)}: ...}}")
    return found


def test_the_branch_scan_finds_every_spelling():
    source = '''
if spec.family == "gemm": pass
if family != 'attention': pass
if "gemm" == name: pass
if fam_name in ("gemm", "attention"): pass
check = {"gemm": 1, "attention": 2}[spec.family]
match kind:
    case "attention": pass
if spec.target == "sm90" and kind == "matmul": pass
if family == "conv" or spec.family is not None: pass
if data.get("family") == family: pass
'''
    lines = sorted((f.split(":")[1] for f in family_branches(source, "x.py")), key=int)
    assert lines == ["2", "3", "4", "5", "6", "8", "10", "10"]


def test_stage_modules_have_no_family_branches():
    found = []
    for path in sorted(GEN.rglob("*.py")):
        if (GEN / "families") not in path.parents:
            found += family_branches(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "family branches outside gen/families/ (move them into a Family function):\n" + "\n".join(found)


# ---- (b) the protocol is implemented, and checked ----

@pytest.mark.parametrize("name", FAMILIES)
def test_shipped_families_implement_every_protocol_member(name):
    family = get_family(name)
    assert check_family(family) is family
    for member, declared in MEMBERS.items():
        assert hasattr(family, member), member
        if callable(declared):
            assert callable(getattr(family, member)), member


def test_every_protocol_function_says_what_it_owns():
    assert len(MEMBERS) > 20
    assert all(fn.__doc__ and fn.__doc__.strip() for fn in MEMBERS.values() if callable(fn))


def _fake_family(**drop_or_replace):
    """A module with every member of the gemm family, less or with the ones named."""
    fake = types.ModuleType("fake_family")
    gemm = get_family("gemm")
    for member in MEMBERS:
        setattr(fake, member, getattr(gemm, member))
    for member, value in drop_or_replace.items():
        if value is None:
            delattr(fake, member)
        else:
            setattr(fake, member, value)
    return fake


def test_an_incomplete_or_misdeclared_family_is_rejected():
    assert check_family(_fake_family())
    with pytest.raises(TypeError, match=r"fake_family.*launch is missing.*case_flops is missing"):
        check_family(_fake_family(launch=None, case_flops=None))
    with pytest.raises(TypeError, match=r"case_flops\(shape\) does not take \['shape', 'case'\]"):
        check_family(_fake_family(case_flops=lambda shape: 0.0))
    with pytest.raises(TypeError, match="CAPTURE_SHAPE is missing"):
        check_family(_fake_family(CAPTURE_SHAPE=None))


def test_an_unknown_family_is_a_spec_error():
    with pytest.raises(SpecError, match="unknown family 'conv'"):
        get_family("conv", "specs/conv.yaml")


# ---- (c) what the stages now get from the families ----

@pytest.fixture(scope="module")
def specs():
    return {f: load_spec(ROOT / "specs" / f"{f}.yaml") for f in FAMILIES}


def test_case_flops_counts_the_dense_work_of_one_call():
    assert get_family("gemm").case_flops((128, 256, 64), {"dtype": "bfloat16"}) == 2 * 128 * 256 * 64
    # a gated case's (M, N, K) names the output: its GEMM has the gate's and the up projection's 2N columns
    assert get_family("gemm").case_flops((128, 256, 64), {"activation": "swiglu"}) == 2 * 128 * 512 * 64
    causal = {"dtype": "bfloat16", "head_dim": 64, "mod": "causal"}  # tuning does not discount the mask
    assert get_family("attention").case_flops((2, 8, 4, 16, 32), causal) == 4 * 2 * 8 * 16 * 32 * 64


def test_verify_cases(specs):
    gemm, attention = specs["gemm"], specs["attention"]
    assert get_family("gemm").verify_cases(gemm) == gemm.verify["cases"] and len(gemm.verify["cases"]) == 16
    assert {c["activation"] for c in gemm.verify["cases"]} >= {"swiglu", "geglu"}   # gated, both weight layouts
    assert {c["b_layout"] for c in gemm.verify["cases"] if c["activation"] in ("swiglu", "geglu")} == {"kn", "nk"}
    residual = [c for c in gemm.verify["cases"] if c["residual"]]   # with and without activation, fp32 out, gated
    assert {c["activation"] for c in residual} == {"none", "silu", "swiglu", "geglu"} \
        and {c["b_layout"] for c in residual} == {"kn", "nk"} and {c["out_dtype"] for c in residual} == {"bfloat16",
                                                                                                     "float32"}
    rms = [c for c in gemm.verify["cases"] if c["rms"]]   # QKV (bias), gate_up (gated), with a residual, fp32 out
    assert {c["activation"] for c in rms} == {"none", "swiglu", "geglu"} and any(c["residual"] for c in rms) \
        and {c["out_dtype"] for c in rms} == {"bfloat16", "float32"} and any(c["bias"] for c in rms)
    cases = get_family("attention").verify_cases(attention)
    mods = ["none", "causal", "window", "softcap", "alibi", "decay"]
    assert cases == [{"dtype": dt, "head_dim": d, "mod": m} for dt in ("bfloat16", "float16") for d in (64, 128)
                     for m in mods]


def test_simulation_cases_and_shapes(specs):
    gemm = get_family("gemm")
    assert gemm.simulation_cases(specs["gemm"]) == specs["gemm"].verify["cases"]
    shapes = gemm.simulation_shapes()
    # partial tiles on both sides, a decode row (the swap-AB path), rows TMA can address (bf16 N, K % 8 == 0)
    assert any(m == 1 for m, _, _ in shapes) and any(m % 64 and n % 64 for m, n, _ in shapes)
    assert all(n % 8 == 0 and k % 8 == 0 for _, n, k in shapes)
    # more 128-row tiles than 2 SMs x 2 TMEM accumulator buffers: a program reuses a buffer its epilogue released
    assert any(-(-m // 128) > 2 * 2 for m, _, _ in shapes)
    attention = get_family("attention")
    cases = attention.simulation_cases(specs["attention"])
    assert [c["mod"] for c in cases] == ["none", "causal", "window", "softcap", "alibi", "decay", "none"]
    assert {(c["dtype"], c["head_dim"]) for c in cases[:-1]} == {("bfloat16", 64)}
    assert cases[-1] == {"dtype": "float16", "head_dim": 128, "mod": "none"}
    shapes = attention.simulation_shapes()
    assert any(lq == 1 for _, _, _, lq, _ in shapes) and any(lq % 128 and lk % 128 for *_, lq, lk in shapes)
    # more (batch, head) tiles than the simulator's 2 SMs: the persistent programs carry state across tiles
    assert any(b * hq >= 3 * 2 for b, hq, *_ in shapes)


def test_dispatch_providers():
    assert get_family("gemm").TORCH_PROVIDERS == ("torch",) and get_family("gemm").DEFAULT_PROVIDER == "torch"
    attention = get_family("attention")
    assert attention.DEFAULT_PROVIDER == "sdpa" and attention.DEFAULT_PROVIDER in attention.TORCH_PROVIDERS
    assert "flex-attention" in attention.SUITE_INDUCTOR_PROVIDERS


class FakeGemm:
    """A variant module with the GEMM launch signature that computes act(a @ b + bias) in torch, or leaves the last
    row unwritten, or refuses the tensors the way a TMA variant does."""

    def __init__(self, skip_last_row=False, tma_ok=True):
        self.skip_last_row, self.tma_ok = skip_last_row, tma_ok

    def tma_compatible(self, a, b, out):
        return self.tma_ok

    def launch(self, a, b, bias, out, activation, num_sms, residual=None, rms=None):
        ref = get_family("gemm").eager_reference(a.float(), b.float(), None if bias is None else bias.float(), activation,
                                                 None if residual is None else residual.float(),
                                                 None if rms is None else rms[1])
        rows = out.shape[0] - 1 if self.skip_last_row else out.shape[0]
        out[:rows] = ref[:rows].to(out.dtype)


class FakeAttention:
    """A variant module with the attention launch signature: the reference in float32, or a finite LSE on rows the
    mask empties."""

    def __init__(self, options, finite_lse=False):
        self.options, self.finite_lse = options, finite_lse

    def launch(self, q, k, v, out, lse, scale, mod, window_left, window_right, softcap, alibi_slopes, num_sms):
        inputs = {"q": q, "k": k, "v": v, "scale": scale, "mod": mod, "window_left": window_left,
                  "window_right": window_right, "softcap": softcap, "alibi_slopes": alibi_slopes}
        o, row_lse = get_family("attention").reference(inputs, self.options, precision=torch.float32)
        out.copy_(o.to(out.dtype))
        lse.copy_(torch.nan_to_num(row_lse, neginf=0.0) if self.finite_lse else row_lse)


def test_gemm_launch_and_judgement_through_verify(specs):
    spec, case = specs["gemm"], specs["gemm"].verify["cases"][3]   # float16 -> float32, bias, silu
    shapes = [[17, 33, 65]]
    good = verify_module(spec, FakeGemm(), [case], shapes, "cpu")
    assert good.ok and good.cases[0]["rel_err"] < 1e-3 and good.cases[0]["case"].startswith("M=17 N=33 K=65 float16")
    missed = verify_module(spec, FakeGemm(skip_last_row=True), [case], shapes, "cpu")
    assert not missed.ok and missed.cases[0]["rel_err"] == math.inf       # the poisoned NaN row shows
    refused = verify_module(spec, FakeGemm(tma_ok=False), [case], shapes, "cpu")
    assert refused.ok and refused.cases[0]["detail"].startswith("not applicable: TMA needs 16-byte aligned rows")
    assert refused.to_manifest()["skipped"] == 1


def test_attention_launch_and_judgement_through_verify(specs):
    spec = specs["attention"]
    case = {"dtype": "bfloat16", "head_dim": 64, "mod": "window"}
    shapes = [[1, 2, 1, 3, 40]]   # window left 0 < Lk - Lq: nothing fully masked; causal on Lq > Lk below is
    good = verify_module(spec, FakeAttention(spec.options), [case], shapes, "cpu")
    assert good.ok and good.cases[0]["rel_err"] < 1e-2 and good.cases[0]["detail"].startswith("lse max abs err")
    assert get_family("attention").not_applicable(None, {}, {}) == ""
    empty_rows = verify_module(spec, FakeAttention(spec.options, finite_lse=True),
                               [{**case, "mod": "causal"}], [[1, 2, 1, 6, 3]], "cpu")
    assert not empty_rows.ok and "LSE finiteness" in empty_rows.cases[0]["detail"]


@pytest.mark.parametrize("name", FAMILIES)
def test_new_outputs_are_shaped_for_launch_and_poisoned_on_request(name, specs):
    family, spec = get_family(name), specs[name]
    case = family.verify_cases(spec)[0]
    shape = family.simulation_shapes()[0]
    inputs = family.make_inputs(shape, case, spec.options, "cpu", torch.Generator().manual_seed(0))
    poisoned = family.new_outputs(inputs, fill=float("nan"))
    expected = {"gemm": {"out": (64, 48)}, "attention": {"out": (1, 2, 130, 64), "lse": (1, 2, 130)}}[name]
    assert {k: tuple(v.shape) for k, v in poisoned.items()} == expected
    assert all(torch.isnan(v).all() for v in poisoned.values())
    assert {k: v.shape for k, v in family.new_outputs(inputs).items()} == {k: v.shape for k, v in poisoned.items()}


def test_sm90_attention_prefetches_q_only_for_mask_only_mods_and_within_shared_memory(specs):
    """Q_STAGES (templates/sm90/attention.py.jinja): by default the mods without a score mod get a second Q slot per
    consumer where it fits beside the K/V ring (never at the ring's cost), score mods keep one (they measured no gain
    and lost 1-3%), an explicit value applies to every mod, and the spec check names the key and its range."""
    from gen.build.compile import load_module_from_text
    from gen.build.render import render_variant

    spec = specs["attention"]

    def module(cfg):
        src = render_variant(spec, "sm90", cfg)
        return load_module_from_text(src.text, src.digest)

    base = dict(spec.targets["sm90"].config)
    m = module(base)
    for head_dim in (64, 128):
        for i, name in enumerate(m.MOD_NAMES):
            c = m._constexprs(head_dim, i)
            masks_only = next(x for x in spec.options["mods"] if x["name"] == name)["score_mod"] == "none"
            assert c["Q_STAGES"] == (2 if masks_only else 1), (head_dim, name, c)
            assert c["STAGES"] == m._plan(head_dim)[0]   # the K/V ring is as deep as without the prefetch
            assert m._smem_bytes(head_dim, c["STAGES"], c["O_IN_Q"], c["Q_STAGES"]) <= m.SMEM_LIMIT
    assert m._constexprs(128, m.MOD_NAMES.index("causal"))["Q_STAGES"] == 2
    forced = module({**base, "Q_STAGES": 1})
    assert {forced._constexprs(128, i)["Q_STAGES"] for i in range(len(forced.MOD_NAMES))} == {1}
    with pytest.raises(SpecError) as e:
        get_family("attention").check_config("sm90", {**base, "Q_STAGES": 3}, "specs/attention.yaml", "targets.sm90.config")
    assert e.value.field == "targets.sm90.config.Q_STAGES"


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_gemm_gated_cases_hold_gate_and_up_and_the_reference_gates(layout):
    """A gated case (M, N, K) draws b [K, 2N] (in nk, the w.t() of a [2N, K] gate_up weight) and a 2N bias, is
    written to an [M, N] output, and its reference is act(z[:, :N]) * z[:, N:] of z = a @ b + bias."""
    import torch.nn.functional as F

    fam = get_family("gemm")
    case = {"dtype": "bfloat16", "out_dtype": "float32", "bias": True, "activation": "geglu", "b_layout": layout}
    inputs = fam.make_inputs((5, 24, 40), case, {}, "cpu", torch.Generator().manual_seed(0))
    assert inputs["b"].shape == (40, 48) and inputs["bias"].shape == (48,)
    assert (inputs["b"].stride(0) == 1) == (layout == "nk")
    assert fam.new_outputs(inputs)["out"].shape == (5, 24)
    z = inputs["a"].double() @ inputs["b"].double() + inputs["bias"].double()
    want = F.gelu(z[:, :24], approximate="tanh") * z[:, 24:]
    assert torch.allclose(fam.reference(inputs, {}), want)
