"""`python -m gen tune SPEC`: on a GPU, pick the fastest *correct* config per target and benchmark shape bucket.

For each target the device runs:
  plan -> render -> compile_many at the primary case -> IR gates      (pruned / failed candidates are counted)
  -> load each survivor -> verify_module on small odd shapes AND at every bucket's shape (the accuracy gate)
  -> time the verified ones per bucket (median of do_bench, rotating >= 3 input sets so L2 does not flatter)
  -> winner per bucket = fastest verified candidate (ties: the lower index, so the spec's default wins ties).
The full table and the winners go into the result store (gen.store; shared via Redis when GEN_CACHE_REDIS is set),
keyed by spec, template, config space, target, versions and device, so a second machine with the same GPU skips the
work; `tune()` returns them as the dict the emitter records under manifest.json's "tuning".

The logic below the GPU glue (buckets, the accuracy gate, winners, progress, keys) is pure and tested on CPU with
fake candidates and timings (tests/test_tune.py).

`python -m gen tune SPEC --from-sweep FILE [--write]` needs no GPU: it reads a workload-suite config sweep
(bench/suite/config_sweep.py) and proposes, per dispatch bucket, the configs to ship as variants
(gen/measure/suite_tune.py), which is how a tuned config reaches the dispatch table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..families import get_family, inputs_on

TUNE_VERSION = "1"     # bump when what a tuning row means changes (folded into the store key via `kind`)
INPUT_SETS = 3         # distinct input sets the timed call rotates among
SMALL_DIM = 1024       # verify shapes with every dimension <= this are the "small odd shapes" of the gate


# ---- buckets ----

@dataclass(frozen=True)
class Bucket:
    key: str          # "M=8192 N=8192 K=8192" / "B=4 Hq=16 Hkv=16 Lq=4096 Lk=4096 D=128"
    shape: tuple      # the spec's bench shape
    case: dict        # the case timed (and verified at the bucket's shape)


def buckets(spec) -> list[Bucket]:
    """The spec's benchmark buckets, as its family cuts them (GEMM: per [M, N, K]; attention: per shape x head dim)."""
    return [Bucket(key, shape, case) for key, shape, case in get_family(spec.family).tune_buckets(spec.bench)]


def small_shapes(spec) -> list:
    """The spec's verify shapes that are small (the odd ones: 1, 17, 33, 65, 100, ...), for the first gate."""
    shapes = [list(s) for s in spec.verify["shapes"] if max(s) <= SMALL_DIM]
    return shapes or [list(spec.verify["shapes"][0])]


def verify_shape(spec, b: Bucket) -> list:
    """The shape the accuracy gate checks at the bucket: the bucket's own, unless the family's float64 reference would
    not fit there (see its accuracy_shape)."""
    return get_family(spec.family).accuracy_shape(b.shape)


# ---- progress ----

class Progress:
    """One line on stderr, rewritten in place: [tune] sm90 [#####.....] 5/10 done, 2 pruned, 1 failed  <note>."""

    def __init__(self, total: int, label: str = "", stream=None, width: int = 20):
        self.total, self.label, self.width = total, label, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.pruned = self.failed = 0
        self.note = ""

    def line(self) -> str:
        filled = self.width * self.done // self.total if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        text = f"[tune] {self.label} [{bar}] {self.done}/{self.total} done, {self.pruned} pruned, {self.failed} failed"
        return text + (f"  {self.note}" if self.note else "")

    def _draw(self) -> None:
        self.stream.write("\r" + self.line()[:160].ljust(100))
        self.stream.flush()

    def update(self, note: str = "") -> None:
        self.note = note
        self._draw()

    def finish_candidate(self, outcome: str, note: str = "") -> None:
        """outcome: "ok" | "pruned" (plan or IR gates) | "failed" (render, compile, load, accuracy, launch)."""
        self.done += 1
        self.pruned += outcome == "pruned"
        self.failed += outcome == "failed"
        self.update(note)

    def close(self) -> None:
        self.note = ""
        self._draw()
        self.stream.write("\n")
        self.stream.flush()


# ---- the accuracy gate and winners ----

PRUNED_STAGES = ("plan", "gates")           # rejected by arithmetic or by the IR gates
FAILED_STAGES = ("render", "compile", "load", "verify", "launch")


@dataclass
class Entry:
    """One candidate of one target on its way through tuning. `stage` is "" while it survives."""
    index: int
    config: dict
    stage: str = ""
    reason: str = ""
    handle: Any = None          # what the verify/time callbacks need (the loaded module, on a GPU)
    max_rel_err: float | None = None

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.config.items())


@dataclass(frozen=True)
class Check:
    """The outcome of one verification (small shapes, or one bucket's shape)."""
    ok: bool
    max_rel_err: float = 0.0
    detail: str = ""


def may_be_timed(checks: list[Check]) -> tuple[bool, str]:
    """The accuracy gate: a candidate is timed only if it passed every check it was given (and was given some)."""
    if not checks:
        return False, "not verified"
    bad = [c for c in checks if not c.ok]
    if bad:
        return False, f"wrong result: max rel err {bad[0].max_rel_err:.3g} {bad[0].detail}".strip()
    return True, ""


def pick_winners(rows: list[dict]) -> dict:
    """bucket -> the fastest verified timed row (ties: lower candidate index), with its speed-up over the default."""
    best: dict = {}
    for r in rows:
        if r.get("stage") != "timed" or not r.get("verified") or r.get("ms") is None or not math.isfinite(r["ms"]):
            continue
        cur = best.get(r["bucket"])
        if cur is None or (r["ms"], r["index"]) < (cur["ms"], cur["index"]):
            best[r["bucket"]] = r
    default = {r["bucket"]: r["ms"] for r in rows if r.get("stage") == "timed" and r.get("verified") and r["index"] == 0}
    out = {}
    for b, r in best.items():
        w = {"index": r["index"], "config": r["config"], "ms": r["ms"]}
        if r.get("tflops") is not None:
            w["tflops"] = r["tflops"]
        if b in default and r["ms"] > 0:
            w["speedup_vs_default"] = round(default[b] / r["ms"], 3)
        out[b] = w
    return out


def evaluate(entries: list[Entry], bkts: list[Bucket], verify: Callable[[Entry, Bucket | None], Check],
             time_ms: Callable[[Entry, Bucket], float], progress: Progress, flops: Callable[[Bucket], float] | None = None,
             load: Callable[[Entry], Any] | None = None) -> list[dict]:
    """Run the survivors through the accuracy gate and time the ones that pass; one row per (candidate, bucket) for
    timed candidates, one row (bucket None) for each candidate rejected before timing.

    verify(entry, None) checks the small odd shapes; verify(entry, bucket) checks at the bucket's shape. Every check
    runs before any timing of that candidate, and a candidate wrong anywhere is timed nowhere.
    """
    rows = []

    def reject(e: Entry, stage: str, reason: str) -> None:
        e.stage, e.reason = stage, reason
        rows.append({"index": e.index, "config": e.config, "bucket": None, "stage": stage, "reason": reason[:500],
                     "verified": False, "max_rel_err": e.max_rel_err})
        progress.finish_candidate("pruned" if stage in PRUNED_STAGES else "failed", f"{e.label}: {stage}")

    for e in entries:
        if e.stage:  # rejected upstream (plan, render, compile, gates)
            reject(e, e.stage, e.reason)
            continue
        if load is not None:
            progress.update(f"loading {e.label}")
            try:
                e.handle = load(e)
            except Exception as ex:
                reject(e, "load", f"{type(ex).__name__}: {ex}")
                continue
        checks = []
        for b in [None, *bkts]:
            progress.update(f"verifying {e.label}" + (f" @ {b.key}" if b else " (small shapes)"))
            try:
                c = verify(e, b)
            except Exception as ex:
                c = Check(False, math.inf, f"{type(ex).__name__}: {ex}"[:300])
            checks.append(c)
            if not c.ok:
                break
        e.max_rel_err = max((c.max_rel_err for c in checks), default=None)
        ok, why = may_be_timed(checks)
        if not ok:
            reject(e, "verify", why)
            continue
        timed = []
        for b in bkts:
            progress.update(f"timing {e.label} @ {b.key}")
            row = {"index": e.index, "config": e.config, "bucket": b.key, "verified": True, "max_rel_err": e.max_rel_err}
            try:
                ms = float(time_ms(e, b))
                row.update(stage="timed", ms=round(ms, 5))
                if flops is not None and ms > 0:
                    row["tflops"] = round(flops(b) / ms / 1e9, 1)
            except Exception as ex:
                row.update(stage="launch", reason=f"{type(ex).__name__}: {ex}"[:300])
            timed.append(row)
        rows.extend(timed)
        progress.finish_candidate("ok" if all(r["stage"] == "timed" for r in timed) else "failed", f"{e.label}: timed")
    return rows


def summarize(rows: list[dict], bkts: list[Bucket]) -> dict:
    """The stored/returned record of one target's tuning: buckets, the full table, the winners, the counts."""
    per_candidate = {}
    for r in rows:
        per_candidate.setdefault(r["index"], r["stage"] if r["bucket"] is None else "timed")
    counts = {"candidates": len(per_candidate),
              "timed": sum(s == "timed" for s in per_candidate.values()),
              "pruned": sum(s in PRUNED_STAGES for s in per_candidate.values()),
              "failed": sum(s in FAILED_STAGES for s in per_candidate.values())}
    return {"buckets": [{"key": b.key, "shape": list(b.shape), "case": b.case} for b in bkts],
            "rows": rows, "winners": pick_winners(rows), "counts": counts}


def store_key(spec, target: str, device: str, vers: dict | None = None) -> str:
    from ..build.render import template_digest, template_path
    from ..store import config_space_fingerprint, result_key

    return result_key(f"tune/{TUNE_VERSION}", spec.sha256, template_digest(template_path(spec, target)),
                      config_space_fingerprint(spec.targets[target].candidates()), target, device=device, vers=vers)


# ---- GPU glue ----

def _entries(spec, target: str, jobs: int | None, progress: Progress) -> list[Entry]:
    """plan -> render -> compile at the primary case -> IR gates; every candidate comes back, rejected ones marked."""
    from ..build import compile as compile_stage
    from ..build import mlir
    from ..build.pipeline import _declared_tmem
    from ..build.plan import plan
    from ..build.render import render_variant
    from ..build.targets import get_target

    tgt = get_target(target)
    entries, to_compile = [], []
    for c in plan(spec, target):
        e = Entry(c.index, c.config)
        entries.append(e)
        if c.pruned:
            e.stage, e.reason = "plan", c.pruned
            continue
        try:
            src = render_variant(spec, target, c.config)
        except Exception as ex:
            e.stage, e.reason = "render", f"{type(ex).__name__}: {ex}"
            continue
        to_compile.append((e, src))
    n = [0]

    def compiled(req, arts):
        n[0] += 1
        progress.update(f"compiled {n[0]}/{len(to_compile)}")

    reqs = [compile_stage.CompileRequest(src, spec.compile_cases[0], tgt) for _, src in to_compile]
    arts = compile_stage.compile_many(reqs, jobs=jobs, progress=compiled) if reqs else []
    for (e, src), a in zip(to_compile, arts):
        report = mlir.inspect(a, tgt, spec.targets[target].expect, _declared_tmem(src))
        if not report.ok:
            e.stage = "compile" if not report.compiled else "gates"
            e.reason = "; ".join(report.failures())
        e.handle = src
    return entries


def _launcher(spec, module, inputs: dict, num_sms: int):
    family = get_family(spec.family)
    outputs = family.new_outputs(inputs)
    return lambda: family.launch(module, inputs, outputs, num_sms)


def tune_target(spec, target: str, info, jobs: int | None = None, stream=None) -> dict:
    """Tune one target on this GPU (no store): the summary dict."""
    import torch

    from .bench import time_ms as bench_time_ms
    from ..build.compile import load_module_from_text
    from .verify import verify_module

    fam = get_family(spec.family)
    bkts = buckets(spec)
    small = small_shapes(spec)
    small_cases = [dict(c) for c in {json.dumps(b.case, sort_keys=True): b.case for b in bkts}.values()]
    progress = Progress(len(spec.targets[target].candidates()), target, stream)
    progress.update("planning and compiling")
    entries = _entries(spec, target, jobs, progress)
    input_sets: dict = {}

    def load(e: Entry):
        return load_module_from_text(e.handle.text, e.handle.digest)

    def verify(e: Entry, b: Bucket | None) -> Check:
        cases, shapes = (small_cases, small) if b is None else ([b.case], [verify_shape(spec, b)])
        rep = verify_module(spec, e.handle, cases, shapes, "cuda", info.num_sms, seed=1000 + e.index)
        bad = [c for c in rep.cases if not c["ok"]]
        return Check(rep.ok, rep.max_rel_err, f"({bad[0]['case']}: {bad[0]['detail']})" if bad else "")

    def time_one(e: Entry, b: Bucket) -> float:
        if b.key not in input_sets:  # built once per bucket, shared by every candidate (a few GB on the GPU at most)
            gen = torch.Generator(device="cpu").manual_seed(7)
            sets = []
            for _ in range(INPUT_SETS):
                inp = fam.make_inputs(list(b.shape), b.case, spec.options, "cpu", gen)
                sets.append(inputs_on(inp, "cuda"))
            input_sets[b.key] = sets
        calls = [_launcher(spec, e.handle, inp, info.num_sms) for inp in input_sets[b.key]]
        i = [0]

        def rotating():
            calls[i[0] % len(calls)]()
            i[0] += 1

        return bench_time_ms(rotating)

    rows = evaluate(entries, bkts, verify, time_one, progress, flops=lambda b: fam.case_flops(b.shape, b.case), load=load)
    progress.close()
    input_sets.clear()
    return summarize(rows, bkts)


def tune(spec, targets: list[str] | None = None, store=None, jobs: int | None = None, force: bool = False,
         stream=None, command: str = "") -> dict:
    """Tune every target of the spec this GPU runs. Returns the manifest's "tuning" record:
    {"device", "command", "versions", "targets": {target: {"key", "cached", "buckets", "rows", "winners", "counts"}}}."""
    from ..runtime.device import device_info
    from ..store import open_store, versions
    from ..build.targets import get_target

    info = device_info(0)
    store = store if store is not None else open_store()
    stream = stream if stream is not None else sys.stderr
    vers = versions()
    out = {"device": info.label, "command": command, "versions": vers, "targets": {}}
    for t in targets or list(spec.targets):
        if not get_target(t).runs_on(info.major):
            stream.write(f"[tune] {t}: this device ({info.label}) cannot run it; skipped\n")
            continue
        key = store_key(spec, t, info.label, vers)
        hit = None if force else store.get(key)
        if hit is not None:
            stream.write(f"[tune] {t}: result found in {store!r} (key {key[:12]}); not re-tuned (--force to redo)\n")
            out["targets"][t] = {**hit, "key": key, "cached": True}
            continue
        t0 = time.perf_counter()
        record = {**tune_target(spec, t, info, jobs, stream), "seconds": round(time.perf_counter() - t0, 1)}
        if record["winners"]:  # a run where nothing passed (a transient GPU fault?) is not cached
            store.put(key, record)
        out["targets"][t] = {**record, "key": key, "cached": False}
    return out


def _from_sweep(spec, path: str, write: bool, all_winners: bool) -> int:
    from . import suite_tune

    try:
        sweep = json.loads(open(path).read())
        if sweep["target"] not in spec.targets or not sweep["rows"] or not sweep["configs"]:
            raise ValueError(f"a sweep of target {sweep['target']!r} with {len(sweep['rows'])} rows; the spec's "
                             f"targets are {sorted(spec.targets)}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --from-sweep {path}: not a config sweep of this spec ({type(e).__name__}: {e}); write one "
              "with bench/suite/config_sweep.py on a GPU", file=sys.stderr)
        return 2
    shipped = suite_tune.rebase(spec, sweep)[1]
    entries = suite_tune.winners(spec.family, sweep, shipped)
    props, notes = suite_tune.proposals(spec, sweep, entries, path, all_winners)
    if write and props:   # what the build would reject is not written
        props, rejected = suite_tune.gate(spec, props)
        notes += rejected
    print(suite_tune.report(sweep, entries, shipped, props, notes))
    if write and props:
        print(f"wrote {suite_tune.write_tuned(spec, props)}: rebuild (python -m gen {spec.path}), then time the new "
              "variants in the workload suite (bench/suite/run.py) and rebuild the dispatch tables")
    return 0


def main(argv=None) -> int:
    from ..build.manifest import format_winners
    from ..build.spec import SpecError, load_spec

    p = argparse.ArgumentParser(prog="python -m gen tune", description="autotune a spec's configs on this GPU")
    p.add_argument("spec", help="a YAML kernel spec, e.g. specs/gemm.yaml")
    p.add_argument("--target", action="append", choices=["sm100", "sm90", "triton"], help="only these targets (repeatable)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile workers (default: CPU count)")
    p.add_argument("--force", action="store_true", help="re-tune even when the store has a result for this key")
    p.add_argument("--json", default=None, help="also write the tuning record (manifest's \"tuning\") to this file")
    p.add_argument("--record", action="store_true",
                   help="write the record into generated/<family>/manifest.json (built from this same spec)")
    p.add_argument("--from-sweep", metavar="FILE", default=None,
                   help="no GPU: per dispatch bucket, the winners of a workload-suite config sweep "
                        "(bench/suite/config_sweep.py) and the variants to ship for them (gen/measure/suite_tune.py)")
    p.add_argument("--write", action="store_true", help="with --from-sweep: add them to specs/tuned/<spec>.yaml")
    p.add_argument("--all-winners", action="store_true",
                   help="with --from-sweep: propose every bucket's winner, not only those the dispatch would pick")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.from_sweep:
        return _from_sweep(spec, args.from_sweep, args.write, args.all_winners)
    if args.write or args.all_winners:
        p.error("--write and --all-winners go with --from-sweep")
    from ..runtime.device import cuda_available

    if not cuda_available():
        print("gen tune: no CUDA GPU found. Tuning times kernels, so it needs a GPU; run it on one "
              "(results are stored and shared through GEN_CACHE_REDIS). Nothing done.", file=sys.stderr)
        return 2
    from ..store import configure_triton_remote_cache

    configure_triton_remote_cache()  # compile workers inherit the environment it sets
    tuning = tune(spec, args.target, jobs=args.jobs, force=args.force,
                  command=" ".join(["python -m gen tune", *(sys.argv[1:] if argv is None else argv)]))
    print(format_winners(tuning))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tuning, f, indent=1)
    if args.record:
        from ..build.manifest import GENERATED, record_tuning

        try:
            record_tuning(GENERATED / spec.family, spec, tuning)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0 if tuning["targets"] and all(r["winners"] for r in tuning["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
