"""Run time: put a generated package's precompiled kernels (gen/build/bundle.py) into Triton's cache.

Triton's JIT looks a kernel up in its cache under a key made of: Triton's own build hash, the kernel's source hash
(source, line number, dependencies), its specialization, the compile options, the backend hash (ptxas version and
arch) and the cache-relevant environment variables. The first two vary by machine and install, so the key cannot be
computed ahead of time. It is computed here, on the user's machine, with Triton's own functions, for each bundled
specialization; the bundled cubin goes into the cache under it, and the JIT's first launch is a cache hit (no
Triton compiler). Anything that does not match (another Triton version or ptxas, an edited kernel, another GPU
arch) is skipped with the reason in the debug log, and that kernel JITs as it would without a bundle.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import lzma
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
_seeded: dict[tuple, SeedResult] = {}   # (kernels dir, case) -> what seeding it did


@dataclass
class SeedResult:
    written: int = 0          # put into the cache now
    present: int = 0          # already in the cache (an earlier process, or Triton compiled it)
    skipped: list = field(default_factory=list)   # [reason]


def _source_and_options(fn, specialization: str, backend):
    """The (ASTSource, Options) the JIT builds for this specialization: Triton's `JITFunction.preload`, read back."""
    import triton.language as tl
    from triton.compiler.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import convert_to_tuple_if_list

    data = json.loads(specialization)
    constexprs = {
        tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
        tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
        for k, v in zip(data["constant_keys"], data["constant_vals"])
    }
    attrs = dict(zip(map(tuple, data["attrs_keys"]), data["attrs_vals"]))
    signature = {k: convert_to_tuple_if_list(v) for k, v in data["signature"].items()}
    # extern_libs name files of the machine that compiled; the JIT here fills in this install's own
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items() if k != "extern_libs"}
    source_cls = GluonASTSource if fn.is_gluon() else ASTSource
    # JITFunction.run parses the options once and triton.compile a second time; do the same
    options = backend.parse_options(backend.parse_options(options).__dict__)
    return source_cls(fn, signature, constexprs, attrs), options


# A bundle's index (its entries' specializations and metadata, JSON): xz-compressed, since its entries repeat the
# same signature and options text and the plain file was 0.45 MB a variant, 13 MB over every release's build.
INDEX = "index.json.xz"
# Its cubins: one xz stream of them all, back to back in index order (an entry's "offset" and "size" place it).
# The specializations of a kernel share most of their bytes (code and line info), which one stream compresses
# together: gemm's sm90 bundle is 0.19 MB so against 1.45 MB as one xz file per cubin (9.0 MB of cubins).
CUBINS = "cubins.xz"


def read_index(kernels_dir) -> dict | None:
    """The index of the bundle in `kernels_dir` (gen/build/bundle.py writes it), or None where there is none."""
    path = Path(kernels_dir) / INDEX
    return json.loads(lzma.decompress(path.read_bytes())) if path.exists() else None


@functools.cache
def _read_index(kernels_dir: Path) -> dict | None:
    """read_index, once per process (each case seeds from it on its first call)."""
    return read_index(kernels_dir)


def read_cubins(kernels_dir, index: dict, end: int) -> bytes:
    """The first `end` bytes of the bundle's cubin stream (every entry with offset + size <= end lies in them): a
    case's first call decompresses up to its last kernel only (at most 20-30 ms for a whole bundle). The stream is
    checked against the index's digest first, so a damaged one is refused rather than partly decoded."""
    stream = (Path(kernels_dir) / CUBINS).read_bytes()
    if hashlib.sha256(stream).hexdigest() != index.get("cubins_sha256"):
        raise lzma.LZMAError(f"{CUBINS} does not match its index (a damaged or partial bundle)")
    cubins = lzma.LZMADecompressor().decompress(stream, max_length=end)
    if len(cubins) < end:
        raise EOFError(f"{CUBINS} ends at byte {len(cubins)}, before {end}")
    return cubins


def seed(kernels_dir, module, case: dict | None = None) -> SeedResult:
    """Seed Triton's cache with the bundle in `kernels_dir` for the kernels of `module` (the imported variant):
    the entries of `case` (e.g. {"dtype": "bfloat16", "head_dim": 128, "mod": "causal"}), or all of them."""
    # called on every launch by the generated packages: the already-seeded check stays a dict lookup
    key = (str(kernels_dir), tuple(sorted(case.items())) if case is not None else None)
    if key in _seeded:
        return _seeded[key]
    result = _seeded[key] = SeedResult()
    kernels_dir = Path(kernels_dir)
    index = _read_index(kernels_dir)
    if index is None:
        result.skipped.append(f"no precompiled bundle at {kernels_dir}")
        log.debug(result.skipped[-1])
        return result
    import triton
    from triton.compiler.compiler import get_cache_invalidating_env_vars, make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    backend = make_backend(target)
    mismatch = ("Triton " + index["triton"] if index["triton"] != triton.__version__ else
                f"arch {index['arch']}" if index["arch"] != target.arch else
                f"backend {index['backend_hash']}" if index["backend_hash"] != backend.hash() else "")
    if mismatch:
        result.skipped.append(f"bundle {kernels_dir} was built for {mismatch}; this install is Triton "
                              f"{triton.__version__}, arch {target.arch}, backend {backend.hash()}: kernels will JIT")
        log.debug(result.skipped[-1])
        return result
    env_vars = get_cache_invalidating_env_vars()
    # the kernels of `case` (an entry several cases launch lists them all in "cases")
    entries = [e for e in index["entries"] if case is None or any(all(c.get(k) == v for k, v in case.items())
                                                                  for c in e.get("cases") or (e["case"],))]
    cubins = None   # decompressed on the first kernel that is not in the cache yet
    for entry in entries:
        fn = getattr(module, entry["kernel"], None)
        if fn is None or fn.cache_key != entry["fn_cache_key"]:
            result.skipped.append(f"{entry['kernel']} {entry['case']}: the kernel source differs from the bundle's")
            continue
        src, options = _source_and_options(fn, entry["specialization"], backend)
        cache_hash = hashlib.sha256(get_cache_key(src, backend, options, env_vars).encode()).hexdigest()
        cache = get_cache_manager(cache_hash)
        name = src.name
        if cache.get_group(f"{name}.json") is not None:
            result.present += 1
            continue
        metadata = {**entry["metadata"], "hash": cache_hash, "extern_libs": [list(x) for x in options.extern_libs]}
        try:
            if cubins is None:
                cubins = read_cubins(kernels_dir, index, max(e["offset"] + e["size"] for e in entries))
            cubin = cubins[entry["offset"]:entry["offset"] + entry["size"]]
            group = {f"{name}.cubin": cache.put(cubin, f"{name}.cubin", binary=True),
                     f"{name}.json": cache.put(json.dumps(metadata), f"{name}.json", binary=False)}
            cache.put_group(f"{name}.json", group)
        except (lzma.LZMAError, EOFError) as e:   # a damaged bundle: its kernels JIT
            result.skipped.append(f"could not read {kernels_dir / CUBINS}: {e}")
            break
        except OSError as e:  # a read-only cache dir, a full disk: the JIT still works
            result.skipped.append(f"could not write Triton's cache: {e}")
            break
        result.written += 1
    for reason in result.skipped:
        log.debug(reason)
    log.debug("precompiled kernels from %s: %d written, %d already cached, %d skipped", kernels_dir, result.written,
              result.present, len(result.skipped))
    return result
