"""`python -m gen scan DIR`: list the Triton kernels of an Inductor or Triton dump and say which spec could replace them.

Reads, recursively, whatever of these DIR (or a single log file) holds:
  - TORCH_COMPILE_DEBUG=1 output (torch_compile_debug/run_*/torchinductor/*/output_code.py) and Inductor's compiled
    graph modules: Triton kernels embedded as `name = async_compile.triton('name', '''source''', ...)`;
  - TORCH_LOGS=output_code logs (the same embedded form, each line behind a log prefix);
  - an Inductor cache (TORCHINDUCTOR_CACHE_DIR): one .py per kernel with `@triton.jit def triton_...`, and
    `.best_config` files saying which autotuning config won;
  - a Triton cache or dump (TRITON_CACHE_DIR, TRITON_DUMP_DIR): one directory per compiled kernel with
    <name>.json (metadata: name, num_warps, shared, target), .ttgir, .ptx, .cubin.
A kernel found in several places (its source in an Inductor file, its IR in the Triton cache) is one entry: the Triton
cache's TTGIR names the Python file it was compiled from, and otherwise a kernel name seen once on each side links them.
Nothing is compiled here: IR figures come only from dumps that hold IR.
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import sys
import textwrap
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..build import mlir

KINDS = ("attention-like", "matmul", "reduction", "pointwise")
# Which of our spec families could replace a kernel of each class.
FAMILY_FOR_KIND = {"matmul": "gemm", "attention-like": "attention"}
TC_OPS = ("tt.dot", "ttng.warp_group_dot", "ttng.tc_gen5_mma")
TC_SASS = ("HMMA", "HGMMA", "UTCHMMA", "UTCQMMA", "UTCIMMA")
INDUCTOR_PREFIX_KIND = {"triton_poi_": "pointwise", "triton_red_": "reduction", "triton_per_": "reduction"}

_MAX_TEXT_BYTES = 64 << 20
_EMBEDDED = re.compile(r"async_compile\.triton\(\s*(['\"])(?P<name>\w+)\1\s*,\s*(?P<q>'''|\"\"\")(?P<src>.*?)(?P=q)", re.S)
# glog-style prefix of torch logs: "V1130 23:41:28.418000 10679 torch/_inductor/graph.py:2722] [0/0] [__output_code] "
_LOG_PREFIX = re.compile(r"^[VIWEDC]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+\]\s(?:\[[^\]]*\]\s)*")
_JIT_DEF = re.compile(r"^@triton\.jit\b.*?^def\s+(\w+)\s*\(", re.M | re.S)
_LOC_FILE = re.compile(r'^#loc\d* = loc\("([^"]+)":(\d+):\d+\)', re.M)
_NUM_WARPS = re.compile(r'"ttg\.num-warps"\s*=\s*(\d+)')
_TARGET = re.compile(r'ttg\.target\s*=\s*"([^"]+)"')

_SRC_DOT = re.compile(r"\btl\.dot(?:_scaled)?\s*\(")
_SRC_EXP = re.compile(r"\b(?:tl|tl\.math|tl_math|libdevice|math)\.exp2?\s*\(|\bexp2\s*\(")
_SRC_MAX_RED = re.compile(r"\btl\.max\s*\(|\btriton_helpers\.max2\s*\(|\btl\.reduce\s*\([^)]*maximum")
_SRC_RED = re.compile(r"\btl\.(?:sum|max|min|reduce|argmax|argmin|xor_sum|cumsum|cumprod|associative_scan)\s*\("
                      r"|\btriton_helpers\.(?:max2|min2|welford\w*|prod|any)\s*\(")
_IR_EXP = re.compile(r"\bmath\.exp2?\b|__nv_exp|ex2\.approx")
_SASS_SEEN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+\S")
_IR_MAXF = re.compile(r"\barith\.(?:maxnumf|maximumf|maxsi|maxui)\b")


class ScanError(ValueError):
    """The path cannot be scanned (missing, empty, or holds no kernel); the message says what was looked for."""


@dataclass(frozen=True)
class ScannedKernel:
    """One Triton kernel of a dump. Figures that the dump does not hold are None (absent), never 0."""
    name: str
    kind: str                          # attention-like | matmul | reduction | pointwise
    reason: str                        # what the class was read from
    where: tuple                       # files it was found in, relative to the scanned root, best first
    origin: tuple                      # inductor-output | inductor-log | inductor-cache | triton-cache | triton-dump | python
    source: str = ""                   # the @triton.jit source, when the dump holds it
    ttgir: str = ""
    ttgir_path: str = ""
    cubin_path: str = ""
    target: str = ""                   # e.g. cuda:90
    versions: int = 0                  # compiled versions in the Triton cache (autotuning configs); 0 = none
    num_warps: int | None = None
    num_stages: int | None = None
    smem_bytes: int | None = None
    regs: int | None = None
    spills: int | None = None
    convert_layouts: int | None = None
    tc_ops: dict = field(default_factory=dict)        # TTGIR tensor-core-capable ops: {op: count}
    tensor_cores: bool | None = None                  # None: no IR to tell
    sass: dict = field(default_factory=dict)          # SASS opcode -> count (gen.build.mlir.SASS_OPS), when a cubin exists
    dots: int = 0                                     # tl.dot in the source, else dot ops in the TTGIR
    used: bool | None = None                          # launched by an Inductor wrapper of this dump; None: no wrapper seen
    families: tuple = ()                              # spec families whose generated kernel could replace it
    note: str = ""

    @property
    def has_ir(self) -> bool:
        return bool(self.ttgir)


# ---------------------------------------------------------------- classification

def _strip_py_comments(src: str) -> str:
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(toks)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return src


def _body(src: str) -> str:
    """The kernel body, without Inductor's decorator metadata (triton_meta, inductor_meta)."""
    m = re.search(r"^def\s+\w+\s*\(", src, re.M)
    return _strip_py_comments(src[m.start():] if m else src)


def _prefix_kind(name: str) -> str | None:
    for prefix, kind in INDUCTOR_PREFIX_KIND.items():
        if name.startswith(prefix):
            return kind
    return None


def classify_source(name: str, source: str) -> tuple[str, str, int]:
    """(kind, reason, number of tl.dot) from Python source. Content first, then Inductor's name prefix."""
    body = _body(source)
    dots = len(_SRC_DOT.findall(body))
    exp, max_red = bool(_SRC_EXP.search(body)), bool(_SRC_MAX_RED.search(body))
    if dots >= 2 and exp and max_red:
        return "attention-like", f"source: {dots} tl.dot with exp and a max reduction between them", dots
    if dots >= 1:
        return "matmul", f"source: {dots} tl.dot" + (" (template)" if name.startswith("triton_tem_") else ""), dots
    prefix = _prefix_kind(name)
    if prefix == "reduction" or _SRC_RED.search(body):
        return "reduction", ("name prefix " + name[:11]) if prefix else "source: reduction op", dots
    return "pointwise", ("name prefix " + name[:11]) if prefix else "source: no dot, no reduction", dots


def _ir_max_reduction(ttgir: str) -> bool:
    for seg in re.split(r'"tt\.reduce"|\btt\.reduce\b(?!\.)', ttgir)[1:]:
        end = seg.find("tt.reduce.return")
        if end >= 0 and _IR_MAXF.search(seg[:end]):
            return True
    return False


def tc_op_counts(ttgir: str) -> dict:
    counts = {op: len(re.findall(re.escape(op) + r"(?![\w.])", ttgir)) for op in TC_OPS}
    return {op: n for op, n in counts.items() if n}


def uses_tensor_cores(ttgir: str, sass: dict | None = None) -> bool:
    """wgmma / tcgen05 ops, or a tt.dot whose result is in an MMA layout (not the FMA fallback); SASS decides if given."""
    if sass:
        return any(sass.get(op) for op in TC_SASS)
    if re.search(r"ttng\.(?:warp_group_dot|tc_gen5_mma)(?![\w.])", ttgir):
        return True
    mma_aliases = set(re.findall(r"^(#\w+) = #ttg\.(?:nvidia_mma|amd_mfma|amd_wmma)<", ttgir, re.M))
    for m in re.finditer(r"\btt\.dot(?![\w.]).*?->\s*tensor<[^>]*?,\s*(#[\w.]+)", ttgir):
        enc = m.group(1)
        if enc in mma_aliases or "mma" in enc:
            return True
    return False


def dot_operand_dtypes(ttgir: str) -> set:
    """Element types of the A/B operands of every dot op in a TTGIR (e.g. {"bf16"}, {"f32"} for TF32/FMA dots)."""
    out = set()
    for line in ttgir.splitlines():
        if not re.search(r"(?:\btt\.dot|ttng\.warp_group_dot|ttng\.tc_gen5_mma)(?![\w.])", line) or " : " not in line:
            continue
        types = re.findall(r"(?:tensor|memdesc)<(?:\d+x)+(\w+)", line.split(" : ", 1)[1])
        out.update(types[:2])
    return out


def classify_ttgir(name: str, ttgir: str) -> tuple[str, str, int]:
    tc = tc_op_counts(ttgir)
    dots = sum(tc.values())
    exp, max_red = bool(_IR_EXP.search(ttgir)), _ir_max_reduction(ttgir)
    ops = ", ".join(f"{n} {op}" for op, n in tc.items())
    if dots >= 2 and exp and max_red:
        return "attention-like", f"TTGIR: {ops} with exp and a max reduction", dots
    if dots >= 1:
        return "matmul", f"TTGIR: {ops}", dots
    prefix = _prefix_kind(name)
    if "tt.reduce" in ttgir or "tt.scan" in ttgir:
        return "reduction", "TTGIR: tt.reduce", dots
    if prefix:
        return prefix, "name prefix " + name[:11], dots
    return "pointwise", "TTGIR: no dot, no reduction", dots


def families_for(kind: str, dots: int) -> tuple[tuple, str]:
    fam = FAMILY_FOR_KIND.get(kind)
    if not fam:
        return (), ""
    note = ""
    if kind == "matmul" and dots > 1:
        note = f"{dots} dot ops: a chain of matmuls; our gemm replaces one of them"
    return (fam,), note


# ---------------------------------------------------------------- reading the dump

@dataclass
class _Found:
    """A kernel's source found in an Inductor file or log."""
    name: str
    source: str
    path: Path
    origin: str
    rank: int                          # lower = better place to quote the source from


@dataclass
class _Compiled:
    """One compiled version of a kernel in a Triton cache / dump directory."""
    name: str
    json_path: Path
    meta: dict
    ttgir_path: Path | None
    cubin_path: Path | None
    src_file: str = ""                 # the Python file the TTGIR says it was compiled from
    src_line: int = 0
    sass_path: Path | None = None      # <name>.sass of a TRITON_DUMP_DIR (nvdisasm text), when there is no cubin
    origin: str = "triton-cache"       # or "triton-dump" (TRITON_DUMP_DIR: no metadata json)


def _read_text(path: Path) -> str:
    try:
        if path.stat().st_size > _MAX_TEXT_BYTES:
            return ""
        data = path.read_bytes()
    except OSError:
        return ""
    if b"\0" in data[:4096]:
        return ""
    return data.decode("utf-8", errors="replace")


def _unprefix_log(text: str) -> str:
    lines = []
    for line in text.splitlines():
        m = _LOG_PREFIX.match(line)
        if m:
            line = line[m.end():]
        elif line.startswith("\t"):          # tlparse structured-trace payload lines
            line = line[1:]
        lines.append(line)
    return "\n".join(lines)


def _normalize(src: str) -> str:
    return textwrap.dedent(src.strip("\n")).strip() + "\n"


def _digest(src: str) -> str:
    return hashlib.sha256(_normalize(src).encode()).hexdigest()[:16]


def embedded_kernels(text: str, log: bool = False) -> list[tuple[str, str]]:
    """(name, source) of every `async_compile.triton('name', '''source''')` in Inductor output code, or in a log
    of it (`log`: strip the torch-log prefix or the structured-trace tab from each line first)."""
    if log:
        text = _unprefix_log(text)
    out = []
    for m in _EMBEDDED.finditer(text):
        src = _normalize(m.group("src"))
        if "@triton.jit" in src or re.search(r"^def\s", src, re.M):
            out.append((m.group("name"), src))
    return out


def jit_functions(text: str) -> list[tuple[str, str]]:
    """(name, source) of every @triton.jit function of a Python file, decorators above it included."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [(m.group(1), text) for m in _JIT_DEF.finditer(text)]
    lines = text.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        if not any("jit" in ast.unparse(d) for d in node.decorator_list):
            continue
        # Inductor's per-kernel files start with imports and a heuristics decorator: keep the whole file then
        if len([n for n in tree.body if isinstance(n, ast.FunctionDef)]) == 1 and node in tree.body:
            out.append((node.name, _normalize(text)))
        else:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            out.append((node.name, _normalize("\n".join(lines[start:node.end_lineno]))))
    return out


def _source_at(path: str, line: int) -> tuple[str, str] | None:
    """(name, source) of the function defined at path:line (what a TTGIR's #loc points at), if the file is there."""
    p = Path(path)
    if not p.is_file():
        return None
    text = _read_text(p)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (node.lineno == line or
                                                  any(d.lineno == line for d in node.decorator_list)):
            lines = text.splitlines()
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            return node.name, _normalize("\n".join(lines[start:node.end_lineno]))
    return None


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith((".lock", ".so", ".pyc")))


def _triton_entry(path: Path) -> _Compiled | None:
    if path.name.startswith("__grp__"):
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or "name" not in meta or not ({"num_warps", "shared", "target"} & set(meta)):
        return None
    return _with_files(_Compiled(meta["name"], path, meta, None, None), path.with_suffix(""))


def _dump_entry(ttgir: Path) -> _Compiled:
    """A kernel of a TRITON_DUMP_DIR (TRITON_KERNEL_DUMP=1): IR files, no metadata json; name and warps from the TTGIR."""
    head = ttgir.read_text(errors="replace")
    m = re.search(r"tt\.func (?:public )?@(\w+)", head)
    meta = {"name": m.group(1) if m else ttgir.stem}
    w = _NUM_WARPS.search(head)
    if w:
        meta["num_warps"] = int(w.group(1))
    return _with_files(_Compiled(meta["name"], ttgir, meta, None, None, origin="triton-dump"), ttgir.with_suffix(""))


def _with_files(c: _Compiled, stem: Path) -> _Compiled:
    ttgir, cubin, sass = stem.with_suffix(".ttgir"), stem.with_suffix(".cubin"), stem.with_suffix(".sass")
    c.ttgir_path = ttgir if ttgir.is_file() else None
    c.cubin_path = cubin if cubin.is_file() else None
    c.sass_path = sass if sass.is_file() and not c.cubin_path else None
    if c.ttgir_path:
        head = c.ttgir_path.read_text(errors="replace")[:20000]
        m = _LOC_FILE.search(head)
        if m:
            c.src_file, c.src_line = m.group(1), int(m.group(2))
    return c


_DUMP_SASS_LINE = re.compile(r"^[\w-]+:[\w-]+:[\w-]+:[\w-]+:\w+\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", re.M)


def dump_sass_counts(text: str) -> dict:
    """SASS opcode counts (gen.build.mlir.SASS_OPS) of the nvdisasm text Triton writes to TRITON_DUMP_DIR/<hash>/<name>.sass."""
    counts: dict = {}
    for m in _DUMP_SASS_LINE.finditer(text):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return {op: counts[op] for op in mlir.SASS_OPS if counts.get(op)}


def _sass_of(cubin: Path) -> tuple[dict, dict]:
    """(SASS opcode counts, resource usage) of a cubin, cached on disk by the cubin's digest (cuobjdump is slow)."""
    from ..cache import cache_dir
    from ..build.compile import _disassemble

    try:
        data = cubin.read_bytes()
    except OSError:
        return {}, {}
    cached = cache_dir("scan-sass") / f"{hashlib.sha256(data).hexdigest()}.json"
    if cached.exists():
        try:
            counts, ru = json.loads(cached.read_text())
            return counts, ru
        except ValueError:
            pass
    try:
        resource, sass = _disassemble(data)
    except Exception:  # no cuobjdump, a cubin it cannot read: the figures stay absent
        return {}, {}
    if not _SASS_SEEN.search(sass):
        return {}, {}
    counts, ru = dict(mlir.sass_counts(sass)), mlir.resource_usage(resource)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps([counts, ru]))
    tmp.replace(cached)
    return counts, ru


def _target_of(meta: dict, ttgir: str) -> str:
    t = meta.get("target")
    if isinstance(t, dict) and "backend" in t:
        return f"{t['backend']}:{t.get('arch', '?')}"
    m = _TARGET.search(ttgir)
    return m.group(1) if m else ""


def _from_inductor(name: str, origin: list) -> bool:
    return name.startswith("triton_") or any(o.startswith("inductor") for o in origin)


def _pick(versions: list[_Compiled], best: dict | None) -> _Compiled:
    """The version Inductor's autotuner kept (its .best_config), else the first."""
    if best:
        for v in versions:
            if all(v.meta.get(k) == best[k] for k in ("num_warps", "num_stages") if k in best):
                return v
    return versions[0]


def scan(path, sass: bool = True) -> list[ScannedKernel]:
    """Every Triton kernel of a dump directory (or one log / output_code file), one entry per distinct kernel."""
    root = Path(path)
    if not root.exists():
        raise ScanError(f"{root} does not exist")
    files = _files(root)
    if not files:
        raise ScanError(f"{root} is empty")
    base = root if root.is_dir() else root.parent

    def rel(p) -> str:
        p = Path(p)
        try:
            return str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            return str(p)

    found: list[_Found] = []
    compiled: list[_Compiled] = []
    best_configs: dict[str, dict] = {}        # kernel file stem -> best config
    wrapper_names: set[str] = set()
    seen_wrapper = False
    for p in files:
        suffix = p.suffix
        if suffix == ".json":
            c = _triton_entry(p)
            if c:
                compiled.append(c)
            continue
        if suffix == ".best_config":
            try:
                best_configs[p.stem] = json.loads(p.read_text())
            except (OSError, ValueError):
                pass
            continue
        if suffix in (".ttgir", ".ttir", ".llir", ".ptx", ".cubin", ".source", ".sass", ".hsaco", ".amdgcn", ".spv"):
            continue
        if p.name.startswith("fx_graph_") or suffix in (".svg", ".dot", ".png", ".html", ".pt", ".bin", ".so"):
            continue
        text = _read_text(p)
        if not text:
            continue
        if "async_compile.triton(" in text:
            emb = embedded_kernels(text, log=suffix != ".py")
            if emb:
                seen_wrapper = True
                if suffix == ".py":
                    origin = "inductor-output" if ("output_code" in p.name or "torch_compile_debug" in str(p)) else "inductor-cache"
                    rank = 0 if origin == "inductor-output" else 1
                else:
                    origin, rank = "inductor-log", 3
                for name, src in emb:
                    wrapper_names.add(name)
                    found.append(_Found(name, src, p, origin, rank))
                continue
        if suffix == ".py" and "triton" in text and "jit" in text:
            origin = "inductor-cache" if "triton_heuristics" in text else "python"
            for name, src in jit_functions(text):
                found.append(_Found(name, src, p, origin, 2))

    covered = {c.ttgir_path for c in compiled if c.ttgir_path}
    for p in files:
        if p.suffix == ".ttgir" and p not in covered:
            compiled.append(_dump_entry(p))

    # Group sources by (name, digest): the same kernel printed in a log, an output_code.py and the cache is one entry.
    groups: dict[tuple, list[_Found]] = {}
    for f in sorted(found, key=lambda f: (f.rank, str(f.path))):
        groups.setdefault((f.name, _digest(f.source)), []).append(f)
    by_file = {}                              # (file, kernel name) -> key
    for key, fs in groups.items():
        for f in fs:
            by_file.setdefault((str(f.path.resolve()), key[0]), key)
    names = {}
    for key in groups:
        names.setdefault(key[0], []).append(key)

    # Attach compiled versions: by the file the TTGIR was compiled from, else by a name seen once among the sources.
    versions: dict[tuple, list[_Compiled]] = {}
    for c in sorted(compiled, key=lambda c: str(c.json_path)):
        key = None
        if c.src_file:
            try:
                key = by_file.get((str(Path(c.src_file).resolve()), c.name))
            except OSError:
                key = None
        if key is None and len(names.get(c.name, [])) == 1:
            key = names[c.name][0]
        if key is None:
            key = (c.name, "ir:" + (c.src_file or ""))
        versions.setdefault(key, []).append(c)

    keys = list(groups) + [k for k in versions if k not in groups]
    chosen_of = {}
    for key in keys:
        fs = groups.get(key, [])
        best = next((best_configs[f.path.stem] for f in fs if f.path.stem in best_configs), None)
        chosen_of[key] = _pick(versions[key], best) if versions.get(key) else None
    cubins = sorted({c.cubin_path for c in chosen_of.values() if c and c.cubin_path}) if sass else []
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        disasm = dict(zip(cubins, pool.map(_sass_of, cubins)))

    kernels = []
    for key in keys:
        name = key[0]
        fs = groups.get(key, [])
        vs = versions.get(key, [])
        source = fs[0].source if fs else ""
        where = [rel(f.path) for f in fs]
        origin = list(dict.fromkeys(f.origin for f in fs))
        chosen = chosen_of[key]
        ttgir = ""
        fig: dict = {}
        if chosen:
            origin.append(chosen.origin)
            where.append(rel(chosen.json_path.parent))
            ttgir = chosen.ttgir_path.read_text(errors="replace") if chosen.ttgir_path else ""
            if not source and chosen.src_file:
                at = _source_at(chosen.src_file, chosen.src_line)
                if at and at[0] == name:
                    source = at[1]
                    origin.append("python")
                    where.append(chosen.src_file)
            md = chosen.meta
            nw = md.get("num_warps")
            if nw is None and ttgir:
                m = _NUM_WARPS.search(ttgir)
                nw = int(m.group(1)) if m else None
            fig = dict(target=_target_of(md, ttgir), num_warps=nw, num_stages=md.get("num_stages"),
                       smem_bytes=md.get("shared"), ttgir_path=rel(chosen.ttgir_path) if chosen.ttgir_path else "",
                       cubin_path=rel(chosen.cubin_path) if chosen.cubin_path else "")
            if ttgir:
                fig["convert_layouts"] = sum(p["count"] for p in mlir.convert_layouts(ttgir))
                fig["tc_ops"] = tc_op_counts(ttgir)
            if chosen.cubin_path in disasm:
                counts, ru = disasm[chosen.cubin_path]
                if ru:
                    fig.update(sass=counts, regs=ru["regs"], spills=counts.get("STL", 0))
            elif sass and chosen.sass_path:
                counts = dump_sass_counts(chosen.sass_path.read_text(errors="replace"))
                fig.update(sass=counts, spills=counts.get("STL", 0))
            if ttgir or fig.get("sass") is not None:
                fig["tensor_cores"] = uses_tensor_cores(ttgir, fig.get("sass"))
        if source:
            kind, reason, dots = classify_source(name, source)
        elif ttgir:
            kind, reason, dots = classify_ttgir(name, ttgir)
        else:
            kind, reason, dots = (_prefix_kind(name) or "pointwise"), "name only (no source, no TTGIR)", 0
        fams, note = families_for(kind, dots)
        if kind in FAMILY_FOR_KIND and ttgir:
            odd = sorted(dot_operand_dtypes(ttgir) - {"bf16", "f16"})
            if odd:
                note = (note + "; " if note else "") + f"{'/'.join(odd)} dot operands: our {fams[0]} takes bf16/fp16"
        kernels.append(ScannedKernel(
            name=name, kind=kind, reason=reason, where=tuple(dict.fromkeys(where)), origin=tuple(dict.fromkeys(origin)),
            source=source, ttgir=ttgir, versions=len(vs), dots=dots,
            used=(name in wrapper_names) if seen_wrapper and _from_inductor(name, origin) else None, families=fams, note=note, **fig))
    if not kernels:
        raise ScanError(f"no Triton kernel found under {root} (looked for Inductor output_code / cache .py files, "
                        "TORCH_LOGS=output_code logs, and Triton cache/dump directories with <kernel>.json)")
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(kernels, key=lambda k: (order.get(k.kind, 9), k.used is False, k.name))


# ---------------------------------------------------------------- printing

def _spec_path(family: str) -> str:
    from ..cache import REPO_ROOT

    p = REPO_ROOT / "specs" / f"{family}.yaml"
    return f"specs/{family}.yaml" if p.exists() else f"specs/{family}.yaml (missing)"


def _fmt(v) -> str:
    return "-" if v is None or v == "" else str(v)


def table(kernels: list[ScannedKernel]) -> str:
    cols = ("kernel", "class", "found in", "warps", "smem B", "cvt", "TC ops (TTGIR)", "key SASS", "replace with")
    rows = []
    short = {"tt.dot": "dot", "ttng.warp_group_dot": "wgmma", "ttng.tc_gen5_mma": "tcgen05"}
    for k in kernels:
        tc = " ".join(f"{short[o]}:{n}" for o, n in k.tc_ops.items()) or ("-" if not k.ttgir else "none")
        sass = " ".join(f"{o}:{k.sass[o]}" for o in ("UTCHMMA", "HGMMA", "HMMA", "UTMALDG", "LDL", "STL") if k.sass.get(o))
        where = k.where[0] if k.where else "-"
        if len(where) > 48:
            where = "..." + where[-45:]
        origin = "+".join(o.replace("inductor-", "ind-").replace("triton-cache", "triton").replace("triton-dump", "dump") for o in k.origin)
        fam = ", ".join(f"{f} ({_spec_path(f)})" for f in k.families) or "-"
        name = k.name + ("" if k.used is not False else " [not launched]")
        rows.append((name, k.kind, f"{origin}: {where}", _fmt(k.num_warps), _fmt(k.smem_bytes), _fmt(k.convert_layouts),
                     tc, sass or ("-" if not k.sass else "none"), fam))
    widths = [max(len(r[i]) for r in rows + [cols]) for i in range(len(cols))]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in [cols] + rows)


def summary(kernels: list[ScannedKernel]) -> str:
    counts = {kind: sum(1 for k in kernels if k.kind == kind) for kind in KINDS}
    lines = [f"{len(kernels)} kernel(s): " + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)]
    for k in kernels:
        if k.families and k.used is not False:
            tc = {True: "on tensor cores", False: "NOT on tensor cores", None: "tensor cores unknown (no IR)"}[k.tensor_cores]
            lines.append(f"  {k.name} ({k.kind}, {tc}): could be replaced by generated.{k.families[0]} "
                         f"({_spec_path(k.families[0])})" + (f"; {k.note}" if k.note else ""))
    if not any(k.families and k.used is not False for k in kernels):
        lines.append("  none of these is a matmul or attention: no spec family of ours replaces them")
    return "\n".join(lines)


def scan_main(path: Path) -> int:
    try:
        kernels = scan(path)
    except ScanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(kernels))
    print()
    print(summary(kernels))
    return 0
