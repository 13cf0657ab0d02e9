"""IR layer (CPU): every shipped variant cross-compiles for its target, meets its gates, and does not regress
against the checked-in baseline (tests/baselines/<family>.json; rewrite with --update-baselines)."""
import hashlib
import json
from pathlib import Path

import pytest

from gen.analysis import baseline
from gen.build.pipeline import run_pipeline
from gen.build.spec import load_spec

from .conftest import ROOT, installed_triton, must_ship, on_tested_triton

BASELINES = ROOT / "tests" / "baselines"


@pytest.fixture(scope="module", params=["gemm", "attention"])
def built(request):
    spec = load_spec(ROOT / "specs" / f"{request.param}.yaml")
    return run_pipeline(spec, log=lambda *a: None)  # as the CLI plans it (the default config may be passed over)


def _shipped_or_skip(built, target: str):
    """The shipped default-config variant of `target`; a skip where this Triton is known not to ship it
    (conftest.MUST_SHIP)."""
    found = [v for v in built.variants if v.name == target]
    if not found and target not in must_ship(built.spec.family, installed_triton(), built.spec.targets):
        pytest.skip(f"{built.spec.family} {target} does not ship on triton {installed_triton()} (README, Limits)")
    (v,) = found
    return v


def test_every_target_ships_a_gated_variant(built):
    shipped = {v.name: v for v in built.variants}
    must = must_ship(built.spec.family, installed_triton(), built.spec.targets)
    assert must <= set(shipped), f"lost: {sorted(must - set(shipped))}; rejected: {built.rejected}"
    for v in shipped.values():
        bad = {json.dumps(r.case): r.failures() for r in v.reports if not r.ok}
        assert not bad, f"{v.name} fails its gates: {bad}"


def test_named_configs_ship_as_their_own_gated_variants(built):
    """A spec's `variants:` entry ships as <target>_<name> with its own config, passing the same gates, beside the
    target's default (or is a rejected candidate that says which variant and why)."""
    for t, ts in built.spec.targets.items():
        if not any(v.name == t for v in built.variants):
            continue
        for vname, cfg in ts.variants.items():
            got = [v for v in built.variants if v.name == f"{t}_{vname}"]
            if not got:
                assert any(r.target == t and f"variant {vname}" in r.reason for r in built.rejected), (t, vname)
                continue
            (v,) = got
            assert v.target == t and v.config == cfg and v.ok
            assert v.source.config == cfg and v.source.text != next(x for x in built.variants if x.name == t).source.text


def test_blackwell_variant_uses_tcgen05_tmem_and_warp_specialization(built):
    v = _shipped_or_skip(built, "sm100")
    for r in v.reports:
        assert r.instructions.get("UTCHMMA", 0) > 0 and r.instructions.get("UTMALDG", 0) > 0
        assert 0 < r.tmem_cols <= 512
        for kernel in {b["kernel"] for b in r.tmem_buffers}:   # each kernel of a case allocates its own
            assert sum(b["cols"] for b in r.tmem_buffers if b["kernel"] == kernel) <= 512, kernel
        assert len(r.partitions) >= 3, r.partitions  # loader, MMA issuer and at least one consumer
        # no spill but the prologue's (values hoisted out of the partitions, allowed per release by specs/by_triton),
        # none reloaded inside a hot loop
        expect = built.spec.targets["sm100"].expect
        assert r.spills == r.prologue_spills <= expect.get("prologue_spills", 0) and r.hot_reloads == 0
        assert r.local_bytes <= expect.get("local_bytes", 0) and r.smem_bytes <= 232_448
        assert r.ttgir_ops.get("tcgen05_mma", 0) > 0


def test_blackwell_cta_pair_variant_is_a_cluster_of_two_issuing_2cta_mmas(built):
    """sm100_pair (specs/by_triton/gemm.yaml, triton >= 3.8): the kernel is compiled for a cluster of two CTAs, every
    tcgen05 MMA is a 2-CTA one (two_ctas, commit multicast to both CTAs) into TMEM laid out over the pair, and it
    passes the sm100 gates with 0 spills, in every compile case."""
    pairs = [v for v in built.variants if v.config.get("CTA_PAIR")]
    if not pairs:
        assert "sm100_pair" not in must_ship(built.spec.family, installed_triton(), built.spec.targets)
        pytest.skip(f"no CTA-pair variant for {built.spec.family} on triton {installed_triton()}")
    for v in pairs:
        assert '"ttg.num-ctas" = 2' in v.ttgir and "twoCTAs = true" in v.ttgir, v.name
        mmas = [ln for ln in v.ttgir.splitlines() if "ttng.tc_gen5_mma " in ln]
        assert mmas and all("two_ctas" in ln and "multicast" in ln for ln in mmas), mmas[:2]
        for r in v.reports:
            assert r.ok and r.spills == 0 and r.hot_reloads == 0 and r.smem_bytes <= 232_448, (v.name, r.case)
            assert r.instructions.get("UTCHMMA", 0) > 0 and len(r.partitions) >= 3


def test_the_shipped_pair_gemm_without_its_pair_ready_barrier_fails_its_gates():
    """The 2-CTA sm100 GEMM (triton >= 3.8) rendered with `ready` as each CTA's own barrier compiles (nothing in
    Triton refuses it) but fails the cta_pair gate; the shipped rendering passes it."""
    from gen.build.compile import Artifact, _compile_in_this_process
    from gen.build.mlir import inspect
    from gen.build.render import render_variant
    from gen.build.targets import get_target
    from gen.families.gemm import has_cta_pairs

    if not has_cta_pairs():
        pytest.skip("2-CTA MMAs compile with triton >= 3.8")
    spec = load_spec(ROOT / "specs" / "gemm.yaml")
    src = render_variant(spec, "sm100", spec.targets["sm100"].variants["pair"])
    line = "ready = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)"
    assert line in src.text
    for text, ok in ((src.text, True), (src.text.replace(line, "ready = mbarrier.allocate_mbarrier(batch=STAGES)"), False)):
        # (a digest of the text: the module file is cached under it, and a fixed name would load a stale one)
        digest = hashlib.sha256(text.encode()).hexdigest()
        arts = [Artifact(**r) for r in _compile_in_this_process(text, digest, spec.compile_cases[0], "sm100", 100)]
        gate = next(g for g in inspect(arts, get_target("sm100"), spec.targets["sm100"].expect).gates
                    if g["gate"] == "cta_pair")
        assert gate["ok"] == ok, gate


def test_hopper_variant_uses_wgmma_and_tma(built):
    v = _shipped_or_skip(built, "sm90")
    for r in [r for x in built.variants if x.target == "sm90" for r in x.reports]:   # named configs too
        assert r.instructions.get("HGMMA", 0) > 0 and r.instructions.get("UTMALDG", 0) > 0
        assert r.spills == 0 and r.smem_bytes <= 232_448
        assert len(r.partitions) >= 2 and any(p["warps"] == 1 for p in r.partitions[1:])


def baseline_path(family: str) -> Path:
    """tests/baselines/<family>.json for the GPU-tested Triton; tests/baselines/triton-<major.minor>/ for another
    release, whose compiler gives other figures for the same source."""
    if on_tested_triton():
        return BASELINES / f"{family}.json"
    from gen.runtime.triton_range import release

    return BASELINES / "triton-{}.{}".format(*release(installed_triton())) / f"{family}.json"


def test_no_regression_against_baseline(built, update_baselines):
    path = baseline_path(built.spec.family)
    current = {v.name: baseline.snapshot(v.reports) for v in built.variants}
    if update_baselines:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert path.exists(), f"no baseline {path}; run pytest --update-baselines"
    saved = json.loads(path.read_text())
    problems = {t: baseline.regressions(current[t], saved[t]) for t in saved if t in current}
    problems = {t: p for t, p in problems.items() if p}
    assert not problems, f"IR regressions (update with --update-baselines if intended): {problems}"
    assert set(saved) <= set(current), f"targets lost: {set(saved) - set(current)}"


def test_baseline_comparison_names_the_figure():
    base = {"smem_bytes": 1000, "tmem_cols": 256, "spills": 0, "local_bytes": 0, "convert_layouts": 1, "regs": 100,
            "instructions": {"UTCHMMA": 4, "UTMALDG": 2}, "sass_size": 2000}
    worse = {**base, "smem_bytes": 2000, "convert_layouts": 3, "spills": 2, "sass_size": 3100,
             "instructions": {"UTCHMMA": 0, "UTMALDG": 2}}
    msgs = " | ".join(baseline.regressions(worse, base))
    for figure in ("smem_bytes", "convert_layouts", "spills", "UTCHMMA", "SASS size"):
        assert figure in msgs
    assert baseline.regressions(base, base) == []


def test_generated_tree_matches_specs_and_templates():
    """generated/ is what `python -m gen` produces today (templates and specs unchanged since the last emit)."""
    from gen.build.emit import variant_header, variant_trailer
    from gen.build.manifest import load_record
    from gen.build.render import render_variant

    for family in ("gemm", "attention"):
        record = load_record(ROOT / "generated" / family)
        # generated/ is the build of the Triton it records (its spec overrides: specs/by_triton/), whichever runs here
        spec = load_spec(ROOT / "specs" / f"{family}.yaml", triton_version=record.versions["triton"])
        assert record.spec_sha256 == spec.sha256, f"specs/{family}.yaml changed: rerun python -m gen"
        for entry in record.variants:
            src = render_variant(spec, entry.target, entry.config)
            name = entry.name
            assert entry.template_digest == src.template_digest, f"{family}/{name}: template changed"

            text = (ROOT / "generated" / family / f"{name}.py").read_text()
            emitted = variant_header(record, entry) + src.text.rstrip("\n") + variant_trailer(entry, family)
            assert text == emitted, f"generated/{family}/{name}.py is stale or hand-edited"
