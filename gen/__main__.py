"""CLI: `python -m gen SPEC...` builds generated/<family>/; sub-commands inspect, simulate, scan.

    python -m gen specs/gemm.yaml                 render, cross-compile, inspect, emit (+ verify on a GPU)
    python -m gen specs/gemm.yaml --bench         ... and benchmark against the baselines (GPU)
    python -m gen inspect generated/gemm          print the IR report of the shipped variants
    python -m gen simulate generated/gemm --target sm100   run a Gluon variant on the CPU simulator
    python -m gen scan DIR                        list the kernels of an Inductor/Triton dump directory
    python -m gen tune SPEC                       on a GPU: accuracy-gated autotuning per shape bucket (gen/measure/tune.py)

Exit status: 0 ok; 1 a target of the spec shipped no variant (every candidate failed its compile or gates; the full
reasons are in .cache/logs/build-<family>.log; --allow-missing-targets ships without it); 2 a bad spec or argument;
141 (128 + SIGPIPE, as for coreutils) when the reader closed stdout early, e.g. `python -m gen inspect generated/gemm
| head`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .build.spec import SpecError


def _print_table(manifest: dict) -> None:
    cols = ("target", "config", "smem B", "TMEM", "regs", "spills", "cvt", "partitions", "key SASS", "gates")
    rows = []
    from .build.manifest import entry_name, format_instructions, spill_figure

    for v in manifest["variants"]:
        c = v["compile"]
        parts = ",".join(f"{p['name'][:7]}:{p['warps']}w/{p['regs'] or '?'}" for p in c["partitions"]) or "-"
        cfg = ",".join(f"{k}={x}" for k, x in v["config"].items())
        fails = [f for case in c["cases"] for f in case["failures"]]
        rows.append((entry_name(v), cfg, str(c["smem_bytes"]), str(c["tmem_cols"] or "-"), str(c["regs"]), spill_figure(c),
                     str(c["convert_layouts"]), parts, format_instructions(c["instructions"]), "pass" if c["ok"] else f"FAIL ({fails[0][:60]})"))
    widths = [max(len(r[i]) for r in rows + [cols]) for i in range(len(cols))]
    for r in [cols] + rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)))


def _untested_triton() -> str:
    """A note for a supported Triton other than the GPU-tested one ('' for that one); the range itself is
    checked when gen.runtime is imported (ImportError naming the versions and the fix)."""
    from .runtime.triton_range import TESTED, installed, release_folder

    found = installed()
    folder = release_folder(found)
    if not folder:
        return ""
    return (f"note: triton {found} is installed: this builds that release's own variants into generated/<family>/"
            f"{folder}/ (the package picks them on triton {found}); generated/<family>/ itself is the build of the "
            f"GPU-tested triton {TESTED}. A target that fails its gates here ships that build's module instead "
            "(compiled by this release on first use); the README's 'Limits' table says which.")


def cmd_build(args) -> int:
    from .build.build_record import assemble
    from .build.emit import emit_modules, versions
    from .build.manifest import GENERATED, load_record, repo_relative, write_record
    from .build.pipeline import run_pipeline
    from .build.spec import load_spec
    from .runtime.triton_range import installed, release_folder

    status = 0
    folder = release_folder(installed())
    warning = _untested_triton()
    if warning and not args.quiet:
        print(warning, file=sys.stderr)
    for path in args.specs:
        t0 = time.perf_counter()
        try:
            spec = load_spec(path)
            result = run_pipeline(spec, targets=args.target, jobs=args.jobs, search=not args.no_search,
                                  log=(lambda *a: None) if args.quiet else print)
        except SpecError as e:  # also planning, e.g. --target sm90 for a spec without an sm90 entry
            print(f"error: {e}", file=sys.stderr)
            status = 2
            continue
        root = Path(args.out) if args.out else GENERATED
        family_dir = root / spec.family / (folder or "")
        record = assemble(result, repo_relative(spec.path), versions(), load_record(family_dir),
                          keep_other_targets=bool(args.target), folder=folder)
        # Modules and bundles before any GPU work: they do not depend on measurements, they exist even if the GPU
        # stage dies, and the bundle's compile workers never share a process with CUDA and Inductor state.
        out = emit_modules(result, record, root, folder)
        _precompile(args, spec, out, record)
        if not args.no_gpu:
            from .runtime.device import cuda_available

            if cuda_available():
                _measure_on_gpu(args, spec, result, record, root)
                out = emit_modules(result, record, root, folder)   # the modules now say what was measured
        write_record(out, record)
        print(f"\n{spec.family}: {len(result.variants)} variant(s) -> {out} ({time.perf_counter() - t0:.1f} s)")
        manifest = record.to_json()
        _print_table(manifest)
        n_rej = len(manifest["rejected"])
        if n_rej:
            print(f"rejected {n_rej} candidate(s):")
            for r in manifest["rejected"]:
                print(f"  {r['target']} {r['config']} [{r['stage']}]: {r['reason'][:160]}")
        log_path = _write_build_log(spec, result)
        shipped = {v.target for v in record.variants if v.ok}
        lost = [t for t in (args.target or spec.targets) if t not in shipped]
        if lost:
            verdict = "shipped without them (--allow-missing-targets)" if args.allow_missing_targets else "FAILED"
            if folder and args.allow_missing_targets:
                verdict += (f"; on triton {installed()} the package runs the GPU-tested build's module for them "
                            f"(generated/{spec.family}/<target>.py, JIT-compiled by this release)")
            print(f"error: {spec.family}: no {'/'.join(lost)} variant passed its gates: build {verdict}; every "
                  f"candidate's full reason is in {log_path}", file=sys.stderr)
        if (lost and not args.allow_missing_targets) or not record.variants:
            status = max(status, 1)
    return status


def _measure_on_gpu(args, spec, result, record, root: Path) -> None:
    """Verify (and with --bench benchmark, with --tune autotune) on this machine's GPU, into `record`."""
    from .measure.gpu import run_on_gpu
    from .measure.inductor import manifest_entry

    command = " ".join(["python -m gen"] + list(args.argv))
    fresh = run_on_gpu(result, bench=args.bench, command=command, inductor_dir=root / spec.family / "inductor")
    captured = fresh.pop("_inductor", None)
    record.add_measurements(fresh)
    if captured:
        record.inductor = manifest_entry(captured, [v.to_json() for v in record.variants])
    if args.tune:
        from .measure.tune import tune

        record.tuning = tune(spec, args.target, jobs=args.jobs, command=command)


def _write_build_log(spec, result) -> Path:
    """Every rejected candidate with its whole reason (the manifest keeps the start of each): .cache/logs/, not
    committed, so a compile error's machine paths never reach generated/."""
    from .cache import cache_dir

    path = cache_dir("logs") / f"build-{spec.family}.log"
    lines = [f"{spec.family}: {len(result.variants)} variant(s) shipped, {len(result.rejected)} candidate(s) rejected"]
    for r in result.rejected:
        lines += ["", f"== {r.target} {r.config} [{r.stage}]", r.reason]
    path.write_text("\n".join(lines) + "\n")
    return path


def _precompile(args, spec, out: Path, record) -> None:
    """Bundle the shipped Gluon variants' binaries (zero-JIT import) into `record`, or drop bundles this build made
    stale."""
    from .build.bundle import BUNDLED_TARGETS, bundle, remove_bundle
    from .build.bundle_check import kernels_changed

    if args.no_precompile:
        for v in record.variants:
            if v.target in BUNDLED_TARGETS and v.precompiled is None:
                remove_bundle(out, v.name)
        return
    targets = {v.name: (v.template_digest, v.config_digest) for v in record.variants
               if v.ok and (not args.target or v.target in args.target)}
    for name in targets:   # a bundle's key cannot see a change in what Python splices into the template
        if kernels_changed(out / f"{name}.py", out / "kernels" / name):
            if not args.quiet:
                print(f"[gen]   {name}: the emitted kernels changed under the same template and config: rebundling")
            remove_bundle(out, name)
    record.add_precompiled(bundle(out, spec.family, spec.options, targets, jobs=args.jobs,
                                  log=(lambda *a: None) if args.quiet else print))


def cmd_inspect(args) -> int:
    from .build.manifest import entry_name

    path = Path(args.dir) / "manifest.json"
    if not path.exists():
        print(f"error: {path} not found; run `python -m gen specs/<family>.yaml` first", file=sys.stderr)
        return 2
    manifest = json.loads(path.read_text())
    _print_table(manifest)
    for v in manifest["variants"]:
        c = v["compile"]
        print(f"\n[{entry_name(v)}] {v['module']}  ({v['runs']})")
        for b in c["tmem_buffers"]:
            print(f"  TMEM {b['name']}: {b['shape']} {b['dtype']} -> {b['cols']} columns ({b.get('kernel', '?')})")
        for p in c["partitions"]:
            print(f"  partition {p['name']}: {p['warps']} warps, {p['regs'] or '?'} regs")
        for p in c["convert_layout_pairs"]:
            print(f"  convert_layout x{p['count']}: {p['src']} -> {p['dst']}")
        print("  SASS: " + ", ".join(f"{k}={n}" for k, n in sorted(c["instructions"].items())))
        print("  TTGIR: " + ", ".join(f"{k}={n}" for k, n in sorted(c["ttgir_ops"].items())))
        for g in c["gates"]:
            print(f"  [{'ok' if g['ok'] else 'FAIL'}] {g['gate']}: {g['detail']}")
        for key in ("verify", "simulate"):
            if key in v:
                print(f"  {key}: {json.dumps({k: v[key][k] for k in ('device', 'cases', 'max_rel_err', 'ok') if k in v[key]})}")
    return 0


def cmd_simulate(args) -> int:
    from .measure.simulate import simulate_family

    return simulate_family(Path(args.dir), args.target, seed=args.seed, record=not args.no_record, late=args.late)


def cmd_scan(args) -> int:
    from .analysis.scan import scan_main

    return scan_main(Path(args.dir))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tune":
        from .measure.tune import main as tune_main

        return tune_main(argv[1:])
    sub = {"inspect": cmd_inspect, "simulate": cmd_simulate, "scan": cmd_scan}
    if argv and argv[0] in sub:
        p = argparse.ArgumentParser(prog=f"python -m gen {argv[0]}")
        p.add_argument("dir", help="generated/<family> (inspect, simulate) or a dump directory (scan)")
        if argv[0] == "simulate":
            p.add_argument("--target", default="sm100",
                           help="a Gluon variant of the package: sm100, sm90 or a named config such as sm90_m64")
            p.add_argument("--seed", type=int, default=0, help="seed for the async-completion order")
            p.add_argument("--late", action="store_true",
                           help="adversarial order: asynchronous operations complete only when no partition can run")
            p.add_argument("--no-record", action="store_true", help="do not write the result into manifest.json")
        args = p.parse_args(argv[1:])
        return sub[argv[0]](args)
    p = argparse.ArgumentParser(prog="python -m gen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="+", help="YAML kernel specs, e.g. specs/attention.yaml")
    p.add_argument("--target", action="append", choices=["sm100", "sm90", "triton"], help="only these targets (repeatable)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile workers (default: CPU count)")
    p.add_argument("--no-search", action="store_true", help="compile only each target's default config")
    p.add_argument("--no-gpu", action="store_true", help="skip verification/benchmarks even if a GPU is present")
    p.add_argument("--bench", action="store_true", help="on a GPU, also benchmark against the baselines")
    p.add_argument("--tune", action="store_true", help="on a GPU, also autotune per shape bucket (recorded in the manifest)")
    p.add_argument("--out", default=None, help="where generated/<family> goes (default: the repo's generated/)")
    p.add_argument("--no-precompile", action="store_true",
                   help="skip bundling the Gluon variants' binaries (generated/<family>/kernels/, zero-JIT import)")
    p.add_argument("--allow-missing-targets", action="store_true",
                   help="exit 0 even when a target of the spec ships no variant (its public op falls back)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    args.argv = argv
    return cmd_build(args)


# Exit status when stdout is closed early (`python -m gen inspect generated/gemm | head`): 128 + SIGPIPE, what the
# shell reports for coreutils killed by the signal, so `set -o pipefail` scripts see the same thing as with `cat`.
EXIT_BROKEN_PIPE = 141


def run(argv=None) -> int:
    """main() for the console: a reader that closes the pipe early ends the command quietly; a Triton outside the
    supported range is one line naming the versions and the fix, exit 2."""
    try:
        from . import runtime  # noqa: F401  (importing it checks the installed Triton: gen/runtime/triton_range.py)
    except ImportError as e:
        print(f"gen: {e}", file=sys.stderr)
        return 2
    try:
        status = main(argv)
        sys.stdout.flush()  # a pipe is block-buffered: the write that finds it closed may be this last one
        return status
    except BrokenPipeError:
        # Python ignores SIGPIPE, so the closed pipe shows up as this exception. Point stdout at devnull so the
        # interpreter's own flush at exit does not fail again ("Exception ignored ... BrokenPipeError").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(run())
