"""Attention mods as one small expression IR: parsed once from the spec, lowered wherever the semantics are needed.

A `Mod` is a score mod (an expression of the scaled score) and a mask (a boolean `keep` expression), each with the
let-bindings its lowerings share (`slope`, `diag`). Expressions are trees of `Num`, `Var`, `Unary`, `Bin`, `Cmp`,
`Call` (the `_sm_*` helpers), `Float` (the value converted to the score's float type) and `Slope` (ALiBi's slope of
head h). The variables are the spec's `score, b, h, q_idx, kv_idx` and the run-time parameters `Lq, Lk, softcap,
window_left, window_right`.

Lowerings:
  evaluate(e, env)   torch on tensors: the float64 reference, FlexAttention's score_mod / mask_mod, the suite's math.
  source(e, ns)      Python text: ns "tl" / "gl" is what the kernels splice in (templates/_lib/score_math.jinja),
                     "torch" the eager path rendered into the generated package (which may not import gen).
  derivative(e)      d e / d score, an expression again (for the backward pass).
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

from ..build.spec_types import SpecError

# What a custom score-mod expression may use: these names, numbers, arithmetic, comparisons and these calls
# (name -> number of arguments, as the templates' _sm_* helpers take them).
EXPR_NAMES = ("score", "b", "h", "q_idx", "kv_idx")
EXPR_CALLS = {"exp": 1, "log": 1, "tanh": 1, "abs": 1, "sqrt": 1, "minimum": 2, "maximum": 2, "where": 3}
EXPR_MAX_CHARS = 500  # bounds the work and the rendered line
EXPR_MAX_DEPTH = 64   # bounds ast.unparse's recursion (`- - - ... score` or `1 + 1 + ...` nest one level per token)
_EXPR_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Load, ast.Constant,
               ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub, ast.UAdd, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq,
               ast.NotEq, ast.BitAnd, ast.BitOr)
FIX = (f"write arithmetic over {list(EXPR_NAMES)} with numbers and the functions {list(EXPR_CALLS)}, "
       "e.g. 'score - 0.1 * abs(q_idx - kv_idx)'")
HELPER = "_sm_"  # the kernels' (and the eager path's) names for the calls: _sm_exp, ...


# ---- the expression tree ----

@dataclass(frozen=True)
class Num:
    value: Union[int, float]


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "+"
    x: "Expr"


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / & |
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Cmp:
    op: str  # < <= > >= == !=
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Call:
    fn: str  # a key of EXPR_CALLS
    args: tuple


@dataclass(frozen=True)
class Float:
    x: "Expr"


@dataclass(frozen=True)
class Slope:
    pass


Expr = Union[Num, Var, Unary, Bin, Cmp, Call, Float, Slope]

_AST_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitAnd: "&", ast.BitOr: "|"}
_AST_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_AST_UNARY = {ast.USub: "-", ast.UAdd: "+"}
_TO_AST = {op: cls for cls, op in (*_AST_BIN.items(), *_AST_CMP.items())}  # unary + and - apart: they share symbols
_UNARY_TO_AST = {op: cls for cls, op in _AST_UNARY.items()}
_PY_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "&": operator.and_,
           "|": operator.or_, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
           "==": operator.eq, "!=": operator.ne}


# ---- parsing (whitelisted AST: nothing is ever eval'ed) ----

def _depth(tree: ast.AST) -> int:
    """Nesting depth of an AST, without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_expr(expr: str, path: str, field: str) -> Expr:
    """A custom score mod's expression as IR; a SpecError naming `field` for anything outside the whitelist."""
    if not isinstance(expr, str) or not expr.strip():
        raise SpecError(path, field, "missing or empty expression", FIX)
    if len(expr) > EXPR_MAX_CHARS:
        raise SpecError(path, field, f"expression of {len(expr)} characters (at most {EXPR_MAX_CHARS})", FIX)
    return _parse(expr, path, field)


def _parse(expr: str, path: str, field: str) -> Expr:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise SpecError(path, field, f"not a Python expression ({e.msg})", FIX) from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, too deeply nested
        raise SpecError(path, field, f"not a Python expression ({type(e).__name__})", FIX) from None
    if _depth(tree) > EXPR_MAX_DEPTH:
        raise SpecError(path, field, f"expression nested deeper than {EXPR_MAX_DEPTH} levels", FIX)
    nodes = list(ast.walk(tree))
    for node in nodes:
        if not isinstance(node, _EXPR_NODES):
            what = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
            raise SpecError(path, field, f"'{what}' ({type(node).__name__}) is not allowed", FIX)
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, (int, float))):
            raise SpecError(path, field, f"constant {node.value!r} is not a number", FIX)
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.func.id not in EXPR_CALLS
                                           or node.keywords):
            raise SpecError(path, field, f"call '{ast.unparse(node)}' is not allowed", FIX)
        if isinstance(node, ast.Call) and len(node.args) != EXPR_CALLS[node.func.id]:
            raise SpecError(path, field, f"'{node.func.id}' takes {EXPR_CALLS[node.func.id]} argument(s), "
                            f"got {len(node.args)}", FIX)
        if isinstance(node, ast.Compare) and len(node.ops) > 1:  # Triton's JIT rejects a < b < c
            raise SpecError(path, field, f"chained comparison '{ast.unparse(node)}' is not allowed", FIX)
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        if isinstance(node, ast.Name):
            if node.id in EXPR_CALLS and id(node) not in callees:
                raise SpecError(path, field, f"function '{node.id}' used as a value", FIX)
            if node.id not in EXPR_NAMES and node.id not in EXPR_CALLS:
                raise SpecError(path, field, f"unknown name '{node.id}'", FIX)
    return _from_ast(tree.body)


def _from_ast(node: ast.expr) -> Expr:
    """The whitelisted AST as IR (recursion bounded by EXPR_MAX_DEPTH)."""
    if isinstance(node, ast.Constant):
        return Num(node.value)
    if isinstance(node, ast.Name):
        return Var(node.id)
    if isinstance(node, ast.UnaryOp):
        return Unary(_AST_UNARY[type(node.op)], _from_ast(node.operand))
    if isinstance(node, ast.BinOp):
        return Bin(_AST_BIN[type(node.op)], _from_ast(node.left), _from_ast(node.right))
    if isinstance(node, ast.Compare):
        return Cmp(_AST_CMP[type(node.ops[0])], _from_ast(node.left), _from_ast(node.comparators[0]))
    return Call(node.func.id, tuple(_from_ast(a) for a in node.args))


def safe_score_expr(expr: str, path: str, field: str) -> str:
    """Validate a custom score mod; its text with the calls spelled as the templates' `_sm_*` helpers (the form the
    spec's options store and the kernels splice in; a parsed expression has no Float or Slope, so no namespace shows)."""
    return source(parse_expr(expr, path, field), "tl")


# ---- lowering to Python text ----

def _to_ast(e: Expr, ns: str) -> ast.expr:
    if isinstance(e, Num):
        return ast.Constant(e.value)
    if isinstance(e, Var):
        return ast.Name(e.name)
    if isinstance(e, Unary):
        return ast.UnaryOp(_UNARY_TO_AST[e.op](), _to_ast(e.x, ns))
    if isinstance(e, Bin):
        return ast.BinOp(_to_ast(e.a, ns), _TO_AST[e.op](), _to_ast(e.b, ns))
    if isinstance(e, Cmp):
        return ast.Compare(_to_ast(e.a, ns), [_TO_AST[e.op]()], [_to_ast(e.b, ns)])
    if isinstance(e, Call):
        return ast.Call(ast.Name(HELPER + e.fn), [_to_ast(a, ns) for a in e.args], [])
    if isinstance(e, Float):  # kernels: the fp32 tile; torch: the dtype of the score it modifies
        target = ast.Attribute(ast.Name("score" if ns == "torch" else ns), "dtype" if ns == "torch" else "float32")
        return ast.Call(ast.Attribute(_to_ast(e.x, ns), "to"), [target], [])
    if isinstance(e, Slope):  # kernels read the [Hq] slopes through alibi_ptr
        if ns == "torch":
            return ast.Subscript(ast.Name("alibi_slopes"), ast.Name("h"))
        return ast.Call(ast.Attribute(ast.Name(ns), "load"), [ast.BinOp(ast.Name("alibi_ptr"), ast.Add(),
                                                                        ast.Name("h"))], [])
    raise TypeError(f"not a mod expression: {e!r}")


def source(e: Expr, ns: str) -> str:
    """Python text of `e` for namespace ns: "tl" (Triton), "gl" (Gluon) or "torch"; calls are `_sm_*` helpers."""
    return ast.unparse(_to_ast(e, ns))


# ---- lowering to torch ----

def _torch_calls():
    import torch

    def tensors(a, b):
        # torch.minimum/maximum take tensors only; a number in a mod (minimum(score, 30.0)) becomes a 0-d tensor,
        # which promotes like the Python number the kernels see
        like = a if isinstance(a, torch.Tensor) else b
        return tuple(x if isinstance(x, torch.Tensor) else torch.tensor(x, device=like.device) for x in (a, b))

    return {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "abs": torch.abs, "sqrt": torch.sqrt,
            "minimum": lambda a, b: torch.minimum(*tensors(a, b)),
            "maximum": lambda a, b: torch.maximum(*tensors(a, b)), "where": torch.where}


def evaluate(e: Expr, env: dict):
    """`e` on torch tensors (or numbers): env maps the variables it reads (and `alibi_slopes` for Slope)."""
    if isinstance(e, Num):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Unary):
        x = evaluate(e.x, env)
        return -x if e.op == "-" else +x
    if isinstance(e, (Bin, Cmp)):
        return _PY_OPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Call):
        return _torch_calls()[e.fn](*(evaluate(a, env) for a in e.args))
    if isinstance(e, Float):
        x = evaluate(e.x, env)
        return x.to(env["score"].dtype) if hasattr(x, "to") else float(x)
    if isinstance(e, Slope):
        return env["alibi_slopes"][env["h"]]
    raise TypeError(f"not a mod expression: {e!r}")


# ---- the derivative with respect to the score ----

def _reads_score(e: Expr) -> bool:
    if isinstance(e, Var):
        return e.name == "score"
    return any(_reads_score(c) for c in _children(e))


def _children(e: Expr) -> tuple:
    if isinstance(e, (Unary, Float)):
        return (e.x,)
    if isinstance(e, (Bin, Cmp)):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args
    return ()


ZERO, ONE = Num(0), Num(1)


def _add(a: Expr, b: Expr) -> Expr:
    return b if a == ZERO else a if b == ZERO else Bin("+", a, b)


def _sub(a: Expr, b: Expr) -> Expr:
    return a if b == ZERO else _neg(b) if a == ZERO else Bin("-", a, b)


def _mul(a: Expr, b: Expr) -> Expr:
    if ZERO in (a, b):
        return ZERO
    return _number(b) if a == ONE else _number(a) if b == ONE else Bin("*", a, b)


def _number(e: Expr) -> Expr:
    """A comparison as 0/1 in the score's float type (e.g. the `score > 0` of d(score * (score > 0)))."""
    return Float(e) if isinstance(e, Cmp) or (isinstance(e, Bin) and e.op in "&|") else e


def _neg(a: Expr) -> Expr:
    return ZERO if a == ZERO else Unary("-", a)


def _where(c: Expr, a: Expr, b: Expr) -> Expr:
    return a if a == b else Call("where", (c, a, b))


def derivative(e: Expr) -> Expr:
    """d e / d score, simplified where a factor is 0 or 1. Comparisons and boolean ops are piecewise constant (0);
    at ties abs, minimum and maximum take torch autograd's choice (0, and half to each side)."""
    if not _reads_score(e):
        return ZERO
    if isinstance(e, Var):
        return ONE
    if isinstance(e, Unary):
        return _neg(derivative(e.x)) if e.op == "-" else derivative(e.x)
    if isinstance(e, Float):
        d = derivative(e.x)
        return d if isinstance(d, Num) else Float(d)
    if isinstance(e, Cmp) or (isinstance(e, Bin) and e.op in "&|"):
        return ZERO
    if isinstance(e, Bin):
        da, db = derivative(e.a), derivative(e.b)
        if e.op == "+":
            return _add(da, db)
        if e.op == "-":
            return _sub(da, db)
        if e.op == "*":
            return _add(_mul(da, e.b), _mul(e.a, db))
        if db == ZERO:  # a / b with b free of the score
            return ZERO if da == ZERO else Bin("/", da, e.b)
        return Bin("/", _sub(_mul(da, e.b), _mul(e.a, db)), Bin("*", e.b, e.b))
    x = e.args[0]
    dx = derivative(x)
    if e.fn == "exp":
        return _mul(e, dx)
    if e.fn == "log":
        return Bin("/", dx, x)
    if e.fn == "tanh":
        return _mul(Bin("-", ONE, Bin("*", e, e)), dx)
    if e.fn == "sqrt":
        return Bin("/", dx, Bin("*", Num(2), e))
    if e.fn == "abs":
        return _where(Cmp(">", x, ZERO), dx, _where(Cmp("<", x, ZERO), _neg(dx), ZERO))
    if e.fn in ("minimum", "maximum"):
        a, b = e.args
        da, db = derivative(a), derivative(b)
        first = Cmp("<" if e.fn == "minimum" else ">", a, b)
        return _where(first, da, _where(Cmp("==", a, b), Bin("/", _add(da, db), Num(2)), db))
    c, a, b = e.args  # where: the condition only selects
    return _where(c, derivative(a), derivative(b))


# ---- mods ----

Q_DIAG = Bin("+", Var("q_idx"), Bin("-", Var("Lk"), Var("Lq")))  # the key on query q_idx's diagonal (bottom-right)


@dataclass(frozen=True)
class Mod:
    name: str
    mask: str                    # none | causal | window (the kernels' KV-range code is chosen by it)
    score_mod: str               # none | softcap | alibi | custom
    score: Expr | None           # the modded score; None: the score unchanged
    keep: Expr | None            # True where the key is visible; None: every key
    lets: tuple = ()             # (name, expr) the score and keep read, bound first (none reads the score)

    def _bind(self, env: dict, e: Expr) -> dict:
        """env with the let-bindings `e` reads (a mask never needs the ALiBi slopes)."""
        env, used = dict(env), _names(e)
        for name, value in self.lets:
            if name in used:
                env[name] = evaluate(value, env)
        return env

    def modded(self, env: dict):
        """The modded score (torch), masked keys not yet applied."""
        return env["score"] if self.score is None else evaluate(self.score, self._bind(env, self.score))

    def visible(self, env: dict):
        """keep as a torch bool tensor, or None for no mask."""
        return None if self.keep is None else evaluate(self.keep, self._bind(env, self.keep))

    def apply(self, env: dict):
        """The modded score with the masked keys at -inf (torch)."""
        score, keep = self.modded(env), self.visible(env)
        return score if keep is None else score.masked_fill(~keep, float("-inf"))

    @property
    def dscore(self) -> Expr:
        """d score_mod / d score; masks and ALiBi pass the gradient through unchanged (1)."""
        return ONE if self.score is None else derivative(self.score)

    def grad(self, env: dict):
        """dscore evaluated (torch)."""
        dscore = self.dscore
        return evaluate(dscore, self._bind(env, dscore))

    @property
    def reads_slope(self) -> bool:
        """Does the modded score read ALiBi's per-head slope (a global load in the kernels)?"""
        return "slope" in _names(self.score)

    def _let_lines(self, ns: str, reads: Expr | None, slope_loaded: bool = False) -> list[str]:
        used = _names(reads)
        # slope_loaded: the kernel loaded the slope itself (once per tile) and passes its value where the helpers
        # take the slopes' pointer, `alibi_ptr`
        return [f"{name} = {'alibi_ptr' if slope_loaded and isinstance(e, Slope) else source(e, ns)}"
                for name, e in self.lets if name in used]

    def score_lines(self, ns: str, slope_loaded: bool = False) -> list[str]:
        """Statements rebinding `score` to the modded score (kernels: "tl" / "gl"; the eager path: "torch").
        slope_loaded: `alibi_ptr` holds the slope's value, not the [Hq] slopes' pointer (kernels only)."""
        if self.score is None:
            return []
        return self._let_lines(ns, self.score, slope_loaded) + [f"score = {source(self.score, ns)}"]

    def dscore_lines(self, ns: str, slope_loaded: bool = False) -> list[str]:
        """Statements setting `dscore`, d score_mod / d score at the (scaled, unmodded) `score` (the backward pass);
        [] where it is 1 (no score mod, ALiBi). slope_loaded as for score_lines."""
        d = self.dscore
        if d == ONE:
            return []
        return self._let_lines(ns, d, slope_loaded) + [f"dscore = {source(d, ns)}"]

    def mask_lines(self, ns: str) -> list[str]:
        """Kernel statements setting masked scores to -inf; keys kv_idx >= Lk are the tile's padding."""
        in_range = Cmp("<", Var("kv_idx"), Var("Lk"))
        if self.keep is None:
            return [f'score = {ns}.where({source(in_range, ns)}, score, -float("inf"))']
        return self._let_lines(ns, self.keep) + [f"keep = {source(Bin('&', self.keep, in_range), ns)}",
                                                  f'score = {ns}.where(keep, score, -float("inf"))']

    def torch_lines(self) -> list[str]:
        """The eager path's statements: score mod, then mask (its tensors hold no padding)."""
        lines = self.score_lines("torch")
        if self.keep is not None:
            lines += self._let_lines("torch", self.keep) + [
                f'score = torch.where({source(self.keep, "torch")}, score, -float("inf"))']
        return lines


def _names(e: Expr | None) -> set[str]:
    if e is None:
        return set()
    return {e.name} if isinstance(e, Var) else set().union(*(_names(c) for c in _children(e)))


_SCORE = {
    "none": None,
    "softcap": Bin("*", Var("softcap"), Call("tanh", (Bin("/", Var("score"), Var("softcap")),))),
    "alibi": Bin("+", Var("score"), Bin("*", Var("slope"), Float(Bin("-", Var("kv_idx"), Q_DIAG)))),
}
_KEEP = {
    "none": None,
    "causal": Cmp("<=", Var("kv_idx"), Q_DIAG),
    "window": Bin("&", Cmp("<=", Var("kv_idx"), Bin("+", Var("diag"), Var("window_right"))),
                  Cmp(">=", Var("kv_idx"), Bin("-", Var("diag"), Var("window_left")))),
}
_LETS = (("slope", Slope()), ("diag", Q_DIAG))


@lru_cache(maxsize=None)
def _mod(name: str, mask: str, score_mod: str, expr: str | None) -> Mod:
    if score_mod == "custom":
        # the stored text (checked, then unparsed: it may be longer than the spec's) spells the calls as _sm_* helpers
        score = Float(_parse(expr.replace(HELPER, ""), "<options>", f"mods.{name}.expr"))
    else:
        score = _SCORE[score_mod]
    keep = _KEEP[mask]
    used = _names(score) | _names(keep)
    return Mod(name, mask, score_mod, score, keep, tuple((n, e) for n, e in _LETS if n in used))


def of(spec_mod: dict) -> Mod:
    """The IR of one checked spec mod (an entry of the attention spec's options["mods"])."""
    return _mod(spec_mod["name"], spec_mod["mask"], spec_mod["score_mod"], spec_mod["expr"])


def flex_mods(mod: Mod, Lq, Lk, window_left=0, window_right=0, softcap=0.0, alibi_slopes=None):
    """(score_mod, mask_mod) for torch's FlexAttention computing `mod`; None where the mod has no such part.
    Lq, Lk may be 0-d tensors, so that a compiled FlexAttention does not recompile for each length."""
    params = {"Lq": Lq, "Lk": Lk, "window_left": window_left, "window_right": window_right, "softcap": softcap,
              "alibi_slopes": alibi_slopes}

    def score_mod(score, b, h, q_idx, kv_idx):
        return mod.modded({**params, "score": score, "b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx})

    def mask_mod(b, h, q_idx, kv_idx):
        return mod.visible({**params, "b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx})

    return (score_mod if mod.score is not None else None), (mask_mod if mod.keep is not None else None)
