"""Property-based fuzzing of spec loading and planning (hypothesis).

The shipped specs are mutated (keys dropped or added, values of the wrong type, out-of-range numbers, random mod
names, custom score-mod expressions from a grammar that includes code-execution attempts) and run through
load_spec + plan for every target. The properties:
  - SpecError is the only exception that escapes (anything else is a crash the user would see as a traceback);
  - no expression reaches code execution: a sentinel planted in builtins and os never fires, an expression with
    attribute access, subscripts, lambdas, dunder names or calls outside the whitelist is always a SpecError, and
    an accepted one, run through the torch reference's evaluator, still cannot reach the sentinel.
Deterministic (derandomize, no example database) so CI sees the same examples every run.
"""
import ast
import builtins
import copy
import os
from contextlib import contextmanager
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings  # the dev extra (pyproject.toml)
from hypothesis import strategies as st

from gen.families import mod_ir
from gen.families.mod_ir import EXPR_CALLS, EXPR_NAMES
from gen.build.plan import plan
from gen.build.spec import SpecError, load_spec
from gen.build.targets import TARGETS

from .conftest import ROOT

SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "specs").glob("*.yaml"))}
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- the sentinel: what running an injected expression would set off ----

FIRED = []
SENTINEL = "__gen_fuzz_sentinel__"


@contextmanager
def armed():
    """A builtin the grammar calls, and os.system / os.popen, all recording instead of acting."""
    def fire(*args, **kwargs):
        FIRED.append(args)

    setattr(builtins, SENTINEL, fire)
    try:
        with mock.patch.object(os, "system", fire), mock.patch.object(os, "popen", fire):
            yield
    finally:
        delattr(builtins, SENTINEL)


# ---- strategies ----

INTERESTING_INTS = [0, -1, 1, 2, 3, 7, 8, 16, 24, 32, 64, 100, 128, 192, 256, 512, 1024, 2 ** 31, 2 ** 63, 10 ** 400]
KNOWN_WORDS = ["gemm", "attention", "sm100", "sm90", "triton", "bfloat16", "float16", "float32", "kn", "nk", "none",
               "causal", "window", "softcap", "alibi", "custom", "gelu_tanh", "relu", "silu", "64", "true", ""]
KNOWN_KEYS = ["family", "op", "description", "options", "targets", "expect", "compile_cases", "verify", "bench",
              "config", "search", "shapes", "cases", "keep_margin", "mods", "head_dims", "b_layout", "name", "mask",
              "score_mod", "left", "right", "cap", "expr", "dtype", "out_dtype", "bias", "activation", "head_dim",
              "mod", "BLOCK_M", "BLOCK_N", "BLOCK_K", "EPI_N", "STAGES", "GROUP_M", "num_warps", "num_stages",
              "Q_TILES", "KV_STAGES", "S_CHUNK", "SOFTMAX_REGS", "RESCALE_THRESHOLD", "PINGPONG", "O_IN_Q",
              "Q_STAGES", "spills", "instructions", "HGMMA"]

scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(INTERESTING_INTS), st.integers(-(10 ** 6), 10 ** 6),
    st.floats(), st.text(max_size=10), st.sampled_from(KNOWN_WORDS),
)
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8), st.integers(-3, 3))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=6)

# Custom score-mod expressions: a grammar of names, numbers, operators and calls, whitelisted or not.
NAMES = list(EXPR_NAMES) + ["secret", "os", "torch", "self", "__import__", "__builtins__", "_sm_exp", SENTINEL]
CALLEES = list(EXPR_CALLS) + ["open", "eval", "exec", "getattr", "print", "globals", "__import__", "_sm_abs", SENTINEL]
ATTRS = ["real", "T", "system", "__class__", "__globals__", "__subclasses__"]
BINOPS = ["+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&", "|", "**", "//", "%", "@", "and", "or"]
MALICIOUS = [
    "__import__('os').system('x')", "().__class__", "().__class__.__bases__[0].__subclasses__()",
    "lambda: 0", "(lambda: __import__('os'))()", "score.real", "exp.__globals__", "getattr(score, 'real')",
    f"{SENTINEL}()", f"score + {SENTINEL}()", "eval('1')", "open('/etc/passwd').read()", "[c for c in ()]",
    "(yield)", "score if score else 0", "(x := 1)", "f'{score}'", "*score", "score[0]", "{**score}",
    "exp(score, base=2)", "exp(*score)", "abs", "score; 1", "score\n+1", "score # " + "x" * 10, "\x00",
    "(" * 300 + "score" + ")" * 300, "-" * 2000 + "score", "-" * 490 + "score", "score" + "+1" * 240, "1" * 5000,
    "abs(" * 60 + "score" + ")" * 60,
]
atoms = st.one_of(
    st.sampled_from(NAMES), st.integers(0, 10 ** 6).map(str), st.floats(0, 1e6).map(repr),
    st.sampled_from(["1e999", "0x1f", "1j", "'a'", "True", "None", "...", "1_000", "9" * 40]),
)


def _compound(sub):
    return st.one_of(
        st.tuples(sub, st.sampled_from(BINOPS), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["-", "+", "~", "not "]), sub).map("".join),
        st.tuples(st.sampled_from(CALLEES), st.lists(sub, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(sub, st.sampled_from(ATTRS)).map(lambda t: f"{t[0]}.{t[1]}"),
        sub.map(lambda s: f"{s}[0]"),
        sub.map(lambda s: f"(lambda: {s})()"),
        st.tuples(sub, sub, sub).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    )


# deep nesting within a short string: what blows the recursion of the parser or of ast.unparse
DEEP = {"-": lambda n: "-" * n + "score", "+": lambda n: "score" + "+1" * n,
        "abs": lambda n: "abs(" * n + "score" + ")" * n, "(": lambda n: "(" * n + "score" + ")" * n}
deep = st.builds(lambda kind, n: DEEP[kind](n), st.sampled_from(sorted(DEEP)), st.integers(1, 400))
expressions = st.one_of(st.recursive(atoms, _compound, max_leaves=8), st.sampled_from(MALICIOUS), deep)
mod_names = st.one_of(st.text(max_size=12), st.sampled_from(["none", "if", "None", "class", "a b", "x.y", "__init__",
                                                             "é", "1x", "_", "causal"]))


# ---- helpers ----

def all_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from all_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from all_paths(v, prefix + (i,))


def get(node, path):
    for k in path:
        node = node[k]
    return node


def retyped(node):
    """The same value as another type: what a YAML typo or a quoting slip produces."""
    out = [str(node), [node], {"value": node}, None, not node]
    if isinstance(node, (int, float)) and not isinstance(node, bool) and abs(node) < 1e300:
        out += [float(node), -node, node + 1, node * 3, 0, 10 ** 400]  # and out-of-range numbers
    return out


def mutate(data, raw):
    """One random edit of the spec tree: change a value's type, replace it, drop it, or add a key/element."""
    paths = list(all_paths(raw))
    leaves = [p for p in paths if not isinstance(get(raw, p), (dict, list))]
    use_leaf = leaves and data.draw(st.integers(0, 4))  # mostly a leaf value, 1 in 5 any node (a whole section)
    path = data.draw(st.sampled_from(leaves) if use_leaf else st.sampled_from(paths), label="path")
    op = data.draw(st.sampled_from(["retype", "retype", "replace", "drop", "add"]), label="op")
    if not path:  # the whole document
        return data.draw(values, label="document")
    parent, key = get(raw, path[:-1]), path[-1]
    node = parent[key]
    if op == "drop":
        del parent[key]
    elif op == "add" and isinstance(node, dict):
        node[data.draw(keys, label="key")] = data.draw(values, label="value")
    elif op == "add" and isinstance(node, list):
        node.append(data.draw(values, label="value"))
    elif op == "retype":
        parent[key] = data.draw(st.sampled_from(retyped(node)), label="retyped")
    else:
        parent[key] = data.draw(values, label="value")
    return raw


def load_and_plan(spec_file, raw):
    """load_spec + plan on every target; returns the spec, or None where a SpecError stopped it."""
    spec_file.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    try:
        spec = load_spec(spec_file)
    except SpecError as e:
        assert e.path == str(spec_file) and isinstance(e.field, str) and e.fix and "Fix:" in str(e)
        return None
    for target in TARGETS:  # a target the spec does not list is a SpecError too
        try:
            cands = plan(spec, target)
        except SpecError:
            assert target not in spec.targets
            continue
        assert cands and cands[0].index == 0 and all(isinstance(c.estimate["smem_bytes"], int) for c in cands)
    return spec


def must_reject(expr: str) -> bool:
    """Independently of gen: would this expression need more than arithmetic over whitelisted names and calls?"""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except Exception:
        return True  # not an expression at all
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Lambda, ast.NamedExpr, ast.Starred, ast.JoinedStr,
                             ast.comprehension, ast.IfExp, ast.BoolOp, ast.Dict, ast.List, ast.Tuple)):
            return True
        if isinstance(node, ast.Name) and (node.id.startswith("_") or node.id not in (*EXPR_NAMES, *EXPR_CALLS)):
            return True
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in EXPR_CALLS):
            return True
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            return True
    return False


def assert_whitelisted(rewritten: str) -> None:
    """What gen accepted (after rewriting calls to the templates' _sm_* helpers) is plain arithmetic."""
    assert "__" not in rewritten and "lambda" not in rewritten
    for node in ast.walk(ast.parse(rewritten, mode="eval")):
        assert not isinstance(node, (ast.Attribute, ast.Subscript, ast.Lambda)), rewritten
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name) and node.func.id[len("_sm_"):] in EXPR_CALLS, rewritten
        elif isinstance(node, ast.Name):
            assert node.id in EXPR_NAMES or node.id[len("_sm_"):] in EXPR_CALLS, rewritten


def run_reference_evaluator(mod: dict) -> None:
    """Evaluate an accepted mod the way the torch reference does; it may fail numerically, never escape."""
    import torch

    score = torch.linspace(-3, 3, 8).view(1, 1, 2, 4)
    idx = torch.arange(4)
    try:
        mod_ir.of(mod).modded({"score": score, "b": torch.zeros(1, 1, 1, 1), "h": torch.zeros(1, 1, 1, 1),
                               "q_idx": idx.view(4, 1)[:2], "kv_idx": idx.view(1, 4)})
    except Exception:
        pass  # e.g. `score & 1` on floats: a runtime type error, not code execution


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "spec.yaml"


# ---- the properties ----

@FUZZ
@given(data=st.data(), family=st.sampled_from(sorted(SHIPPED)), n_edits=st.integers(1, 3))
def test_mutated_specs_raise_only_spec_errors(spec_file, data, family, n_edits):
    raw = copy.deepcopy(SHIPPED[family])
    for _ in range(n_edits):
        raw = mutate(data, raw)
    with armed():
        load_and_plan(spec_file, raw)
    assert not FIRED


def check_expression(spec_file, expr):
    """The shipped attention spec with its custom mod's expr replaced: a SpecError on that field, or plain math."""
    raw = copy.deepcopy(SHIPPED["attention"])
    (i,) = [i for i, m in enumerate(raw["options"]["mods"]) if m.get("score_mod") == "custom"]
    raw["options"]["mods"][i]["expr"] = expr
    with armed():
        try:
            spec_file.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
            spec = load_spec(spec_file)
        except SpecError as e:
            assert e.field == f"options.mods[{i}].expr", str(e)
        else:
            assert not must_reject(expr), f"accepted {expr!r}"
            rewritten = spec.options["mods"][i]["expr"]
            assert_whitelisted(rewritten)
            run_reference_evaluator(spec.options["mods"][i])
            for target in spec.targets:
                plan(spec, target)
    assert not FIRED, f"{expr!r} reached code execution"


@FUZZ
@given(expr=expressions)
def test_custom_expressions_never_execute(spec_file, expr):
    check_expression(spec_file, expr)


# every hand-written attack and every kind of deep nesting, not just the ones the fuzzer happens to draw
@pytest.mark.parametrize("expr", MALICIOUS + [DEEP[kind](n) for kind in sorted(DEEP) for n in (60, 250, 490)],
                         ids=lambda e: repr(e)[:30])
def test_known_attacks_never_execute(spec_file, expr):
    check_expression(spec_file, expr)


@FUZZ
@given(name=mod_names, where=st.integers(0, len(SHIPPED["attention"]["options"]["mods"]) - 1))
def test_random_mod_names(spec_file, name, where):
    raw = copy.deepcopy(SHIPPED["attention"])
    mod = raw["options"]["mods"][where]
    old, mod["name"] = mod["name"], name
    for case in raw.get("compile_cases", []):  # renamed where it is used, so a good name loads and plans
        if case.get("mod") == old:
            case["mod"] = name
    bench = raw.get("bench", {})
    if "mods" in bench:
        bench["mods"] = [name if m == old else m for m in bench["mods"]]
    spec = load_and_plan(spec_file, raw)
    if spec is not None:
        names = [m["name"] for m in spec.options["mods"]]
        assert name.isidentifier() and len(set(names)) == len(names)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=64)))
def test_arbitrary_files_raise_only_spec_errors(spec_file, text):
    if isinstance(text, bytes):
        spec_file.write_bytes(text)
    else:
        spec_file.write_text(text)
    try:
        load_spec(spec_file)
    except SpecError:
        pass


def test_the_sentinel_would_fire():
    """The harness itself: evaluating an injected call with builtins does set off the sentinel."""
    try:
        with armed():
            eval(f"{SENTINEL}()")  # noqa: S307 - the point of the check
            eval("__import__('os').system('x')")  # noqa: S307
        assert len(FIRED) == 2
    finally:
        FIRED.clear()
