"""Spec validation: every error names the file, the field and the fix."""
import textwrap

import pytest
import yaml

from gen.build.spec import SpecError, load_spec

from .conftest import ROOT

GOOD_GEMM = """
family: gemm
op: gemm
targets:
  triton:
    config: {BLOCK_M: 64, BLOCK_N: 64, BLOCK_K: 32, GROUP_M: 8, num_warps: 4, num_stages: 2}
"""


def write(tmp_path, text, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_for(tmp_path, text) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    return info.value


def test_shipped_specs_load():
    gemm = load_spec("specs/gemm.yaml")
    assert gemm.family == "gemm" and set(gemm.targets) == {"sm100", "sm90", "triton"}
    att = load_spec("specs/attention.yaml")
    assert {m["name"] for m in att.options["mods"]} >= {"none", "causal", "window", "softcap", "alibi"}


def test_minimal_spec_gets_defaults(tmp_path):
    spec = load_spec(write(tmp_path, GOOD_GEMM))
    assert spec.options == {}  # the B layout is per case now, not a GEMM option
    assert spec.compile_cases[0]["activation"] == "gelu_tanh" and spec.compile_cases[0]["b_layout"] == "kn"
    assert len(spec.sha256) == 64


def test_malformed_yaml_names_line(tmp_path):
    e = error_for(tmp_path, "family: gemm\nop: [gemm\n")
    assert e.field == "<yaml>" and "line" in e.problem and "Fix:" in str(e)


def test_missing_file():
    with pytest.raises(SpecError, match="cannot read"):
        load_spec("specs/does_not_exist.yaml")


def test_unknown_top_level_field(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "tile_sizes: 3\n")
    assert e.field == "tile_sizes" and "unknown field" in e.problem and "targets" in e.fix


def test_unknown_family(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM.replace("family: gemm", "family: conv"))
    assert e.field == "family" and "attention" in e.fix


def test_unknown_target(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM.replace("triton:", "sm80:"))
    assert e.field == "targets.sm80" and "sm100" in e.fix


def test_missing_config_key(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM.replace("GROUP_M: 8, ", ""))
    assert e.field == "targets.triton.config.GROUP_M" and "missing" in e.problem


def test_non_power_of_two_tile(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM.replace("BLOCK_N: 64", "BLOCK_N: 96"))
    assert e.field == "targets.triton.config.BLOCK_N" and "power of two" in e.problem


def test_impossible_tcgen05_tile(tmp_path):
    text = """
    family: gemm
    op: gemm
    targets:
      sm100:
        config: {BLOCK_M: 256, BLOCK_N: 128, BLOCK_K: 64, STAGES: 3, ACC_BUFFERS: 2, EPI_N: 64, GROUP_M: 8, num_warps: 4}
    """
    e = error_for(tmp_path, text)
    assert e.field == "targets.sm100.config.BLOCK_M" and "tcgen05" in e.problem and "128" in e.fix


def test_impossible_wgmma_split(tmp_path):
    text = """
    family: gemm
    op: gemm
    targets:
      sm90:
        config: {BLOCK_M: 256, BLOCK_N: 128, BLOCK_K: 64, STAGES: 3, GROUP_M: 8, EPI_N: 64, LOAD_REGS: 24, num_warps: 8}
    """
    e = error_for(tmp_path, text)
    assert e.field == "targets.sm90.config.BLOCK_M" and "warpgroups" in e.problem


def test_search_value_is_checked(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "    search: {BLOCK_K: [32, 48]}\n")
    assert e.field == "targets.triton.search.BLOCK_K"


def test_search_key_must_be_in_config(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "    search: {SPLIT_K: [2]}\n")
    assert e.field == "targets.triton.search.SPLIT_K" and "config" in e.fix


def test_bad_case_value(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "compile_cases: [{dtype: float8}]\n")
    assert e.field == "compile_cases[0].dtype" and "bfloat16" in e.fix


def test_bad_expectation(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "expect: {spill: 0}\n")
    assert e.field == "expect.spill" and "spills" in e.fix


def test_bad_verify_shape(tmp_path):
    e = error_for(tmp_path, GOOD_GEMM + "verify: {shapes: [[0, 4, 4]]}\n")
    assert e.field == "verify.shapes[0]"


ATT = """
family: attention
op: attention
options:
  mods:
{mods}
targets:
  triton:
    config: {{BLOCK_M: 64, BLOCK_N: 64, num_warps: 4, num_stages: 2}}
"""


def att(mods: str) -> str:
    return ATT.format(mods=textwrap.indent(textwrap.dedent(mods).strip(), "    "))


def test_custom_expression_is_rewritten(tmp_path):
    spec = load_spec(write(tmp_path, att("- {name: decay, score_mod: custom, expr: 'score - 0.1 * abs(q_idx - kv_idx)'}")))
    assert spec.options["mods"][0]["expr"] == "score - 0.1 * _sm_abs(q_idx - kv_idx)"


@pytest.mark.parametrize("expr, problem", [
    ("__import__('os').system('x')", "not allowed"),
    ("score.real", "not allowed"),
    ("open('f')", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("score + secret", "unknown name 'secret'"),
    ("score +", "not a Python expression"),
    ("score + 'a'", "not a number"),
    ("[score][0]", "not allowed"),
])
def test_unsafe_expressions_rejected(tmp_path, expr, problem):
    e = error_for(tmp_path, att(f"- {{name: bad, score_mod: custom, expr: \"{expr}\"}}"))
    assert e.field == "options.mods[0].expr" and problem in e.problem and "abs(q_idx - kv_idx)" in e.fix


def test_window_needs_sizes(tmp_path):
    e = error_for(tmp_path, att("- {name: w, mask: window}"))
    assert e.field == "options.mods[0].left"


def test_softcap_needs_cap(tmp_path):
    e = error_for(tmp_path, att("- {name: s, score_mod: softcap, cap: -1}"))
    assert e.field == "options.mods[0].cap"


def test_duplicate_mod_names(tmp_path):
    e = error_for(tmp_path, att("- {name: a}\n- {name: a, mask: causal}"))
    assert e.field == "options.mods" and "duplicate" in e.problem


def test_gqa_shape_checked(tmp_path):
    e = error_for(tmp_path, att("- {name: a}") + "verify: {shapes: [[1, 6, 4, 8, 8]]}\n")
    assert e.field == "verify.shapes[0]" and "Hkv" in e.problem


# ---- wrong types: a SpecError naming the field, never a TypeError/ZeroDivisionError from deeper down ----

def shipped_with(tmp_path, family, where, value):
    """specs/<family>.yaml with the entry at `where` (a path of keys and indices) set to `value`."""
    raw = yaml.safe_load((ROOT / "specs" / f"{family}.yaml").read_text())
    node = raw
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return write(tmp_path, yaml.safe_dump(raw, sort_keys=False))


BIG_INT = 10 ** 400


def _short_id(value):
    return ".".join(map(str, value)) if isinstance(value, tuple) else repr(value)[:24]


@pytest.mark.parametrize("family, where, value, field", [
    # gemm target configs: strings, floats, bools and zeros where the checks or the estimate do integer arithmetic
    ("gemm", ("targets", "sm90", "config", "EPI_N"), "64", "targets.sm90.config.EPI_N"),
    ("gemm", ("targets", "sm100", "config", "EPI_N"), 0, "targets.sm100.config.EPI_N"),
    ("gemm", ("targets", "sm100", "config", "ACC_BUFFERS"), True, "targets.sm100.config.ACC_BUFFERS"),
    ("gemm", ("targets", "sm90", "config", "LOAD_REGS"), 24.0, "targets.sm90.config.LOAD_REGS"),
    ("gemm", ("targets", "sm90", "config", "SWAP_AB"), 2, "targets.sm90.config.SWAP_AB"),
    ("gemm", ("targets", "sm90", "config", "SWAP_AB"), True, "targets.sm90.config.SWAP_AB"),
    ("gemm", ("targets", "sm100", "config", "SWAP_AB"), 1, "targets.sm100.config.SWAP_AB"),
    ("gemm", ("targets", "triton", "config", "GROUP_M"), "8", "targets.triton.config.GROUP_M"),
    ("gemm", ("targets", "triton", "config", "num_stages"), "3", "targets.triton.config.num_stages"),
    ("gemm", ("targets", "sm90", "search", "STAGES"), [3, "4"], "targets.sm90.search.STAGES"),
    ("gemm", ("targets", "sm90", "search"), 0, "targets.sm90.search"),
    ("gemm", ("targets", "sm90", "expect", "instructions", "HGMMA"), True, "targets.sm90.expect.instructions.HGMMA"),
    # list fields given as scalars, optional sections given as the wrong type
    ("gemm", ("verify", "cases"), 3, "verify.cases"),
    ("gemm", ("verify", "cases"), None, "verify.cases"),
    ("gemm", ("bench", "cases"), "none", "bench.cases"),
    ("gemm", ("verify", "shapes", 0), [1, True, 1], "verify.shapes[0]"),
    ("gemm", ("bench", "keep_margin"), float("nan"), "bench.keep_margin"),
    ("gemm", ("bench", "keep_margin"), BIG_INT, "bench.keep_margin"),
    ("gemm", ("bench", "shape"), [[1, 1, 1]], "bench.shape"),
    ("gemm", ("compile_cases",), 0, "compile_cases"),
    ("gemm", ("options",), [], "options"),
    ("gemm", ("description",), ["act"], "description"),
    # attention: the estimate reads Q_TILES; bench.head_dims is iterated; head dims render into the kernels
    ("attention", ("targets", "sm100", "config", "Q_TILES"), "2", "targets.sm100.config.Q_TILES"),
    ("attention", ("targets", "sm100", "config", "RESCALE_THRESHOLD"), float("inf"), "targets.sm100.config.RESCALE_THRESHOLD"),
    ("attention", ("targets", "sm90", "config", "PINGPONG"), "yes", "targets.sm90.config.PINGPONG"),
    ("attention", ("targets", "triton", "config", "num_stages"), [3], "targets.triton.config.num_stages"),
    ("attention", ("bench", "head_dims"), 64, "bench.head_dims"),
    ("attention", ("options", "head_dims"), [64.0, 128], "options.head_dims[0]"),
    ("attention", ("options", "head_dims"), "64", "options.head_dims"),
    ("attention", ("options", "mods", 3, "cap"), float("nan"), "options.mods[3].cap"),
    ("attention", ("options", "mods", 0, "right"), "x", "options.mods[0].right"),
    ("attention", ("options", "mods", 0, "cap"), "x", "options.mods[0].cap"),
    ("attention", ("options", "mods", 2, "left"), BIG_INT, "options.mods[2].left"),
    ("attention", ("verify", "cases"), [], "verify.cases"),
], ids=_short_id)
def test_wrong_type_is_a_spec_error(tmp_path, family, where, value, field):
    path = shipped_with(tmp_path, family, where, value)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    e = info.value
    assert e.path == str(path) and e.field == field and e.fix, str(e)


def test_attention_rejects_unknown_config_keys_like_gemm(tmp_path):
    e = error_for(tmp_path, att("- {name: a}").replace("num_stages: 2", "num_stages: 2, BLOCK_K: 64"))
    assert e.field == "targets.triton.config.BLOCK_K" and "not a config key" in e.problem
    assert "BLOCK_M" in e.fix and "num_stages" in e.fix  # lists the known keys
    e = error_for(tmp_path, GOOD_GEMM.replace("num_stages: 2", "num_stages: 2, KV_STAGES: 2"))
    assert e.field == "targets.triton.config.KV_STAGES" and "num_stages" in e.fix


def test_plan_for_a_target_the_spec_does_not_list(tmp_path):
    from gen.build.plan import plan

    spec = load_spec(write(tmp_path, GOOD_GEMM))
    with pytest.raises(SpecError) as info:
        plan(spec, "sm90")
    assert info.value.field == "targets.sm90" and "triton" in info.value.fix


def test_cli_target_missing_from_spec_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    spec = write(tmp_path, GOOD_GEMM)
    proc = subprocess.run([sys.executable, "-m", "gen", str(spec), "--target", "sm90", "--no-gpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "field 'targets.sm90'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("expr, problem", [
    ("where(score)", "takes 3 argument(s)"),
    ("q_idx < kv_idx < score", "chained comparison"),
    ("score" + " + 1" * 300, "at most"),
    ("score\x00", "not a Python expression"),
    ("-" * 490 + "score", "nested deeper"),  # within the length limit, but ast.unparse would recurse too deep
    ("score" + " + 1" * 100, "nested deeper"),
])
def test_expressions_the_kernels_cannot_compile_are_rejected(tmp_path, expr, problem):
    from gen.families.mod_ir import safe_score_expr

    with pytest.raises(SpecError) as info:
        safe_score_expr(expr, "spec.yaml", "options.mods[0].expr")
    assert problem in info.value.problem


def _with_by_triton(tmp_path, text):
    spec = write(tmp_path, GOOD_GEMM)
    (tmp_path / "by_triton").mkdir()
    (tmp_path / "by_triton" / "spec.yaml").write_text(textwrap.dedent(text))
    return spec


def test_by_triton_overrides_apply_only_to_their_releases(tmp_path):
    path = _with_by_triton(tmp_path, """
        triton:
          ">=3.9": {BLOCK_N: 32}
          "3.8": {num_stages: 3}
    """)
    plain = load_spec(write(tmp_path / "by_triton", GOOD_GEMM, "other.yaml"))  # no overrides file for this one
    old, mid, new = (load_spec(path, v) for v in ("3.6.0", "3.8.0", "3.9.0"))
    assert old.targets["triton"].config["BLOCK_N"] == 64 and old.targets["triton"].by_triton == {}
    assert old.sha256 == plain.sha256  # a release no range matches: the spec's identity is its text alone
    assert mid.targets["triton"].config["num_stages"] == 3 and mid.targets["triton"].config["BLOCK_N"] == 64
    assert new.targets["triton"].config["BLOCK_N"] == 32 and new.targets["triton"].by_triton == {"BLOCK_N": 32}
    assert len({old.sha256, mid.sha256, new.sha256}) == 3


def test_a_variant_a_release_override_makes_the_default_is_left_out_for_that_release(tmp_path):
    """sm90's n64 variant under Triton 3.9, whose override sets BLOCK_N 64 in every config: that release's default
    already is the variant, so the variant is dropped there (not a spec error), and kept for the other releases."""
    spec = write(tmp_path, GOOD_GEMM.replace("num_stages: 2}", "num_stages: 2}\n    variants: {n32: {BLOCK_N: 32}}"))
    (tmp_path / "by_triton").mkdir()
    (tmp_path / "by_triton" / "spec.yaml").write_text('triton: {">=3.9": {BLOCK_N: 32}}\n')
    assert load_spec(spec, "3.6.0").targets["triton"].variants == {"n32": {
        "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}}
    new = load_spec(spec, "3.9.0").targets["triton"]
    assert new.variants == {} and new.config["BLOCK_N"] == 32


def test_by_triton_expect_merges_over_the_targets_expectations_for_its_releases_only(tmp_path):
    """A range's `expect:` (a gate a release's compiler needs relaxed, named and bounded) merges over the target's
    expectations, across ranges too; it is not a config key, and the tested release keeps the spec's gates."""
    path = _with_by_triton(tmp_path, """
        triton:
          ">=3.8": {expect: {prologue_spills: 2, local_bytes: 8}}
          ">=3.9": {BLOCK_N: 32, expect: {prologue_spills: 3}}
    """)
    old, mid, new = (load_spec(path, v).targets["triton"] for v in ("3.6.0", "3.8.0", "3.9.0"))
    assert "prologue_spills" not in old.expect and old.by_triton == {}
    assert mid.expect["prologue_spills"] == 2 and mid.expect["local_bytes"] == 8 and "expect" not in mid.config
    assert mid.by_triton == {} and mid.config == old.config
    assert new.expect["prologue_spills"] == 3 and new.expect["local_bytes"] == 8 and new.by_triton == {"BLOCK_N": 32}


@pytest.mark.parametrize("text, field", [
    ('triton: {">=3.8": {expect: {prologue_spill: 2}}}', "triton.>=3.8.expect.prologue_spill"),   # a typo
    ('triton: {">=3.8": {expect: {prologue_spills: -1}}}', "triton.>=3.8.expect.prologue_spills"),
    ('triton: {"~3.9": {BLOCK_N: 32}}', "triton.~3.9"),
    ('sm90: {">=3.9": {BLOCK_N: 64}}', "sm90"),                 # a target the spec does not list
    ('triton: {">=3.6": {BLOCK_N: 48}}', "targets.triton.config.BLOCK_N"),  # checked like the config itself
])
def test_by_triton_errors_name_the_field(tmp_path, text, field):
    with pytest.raises(SpecError) as info:
        load_spec(_with_by_triton(tmp_path, text), "3.9.0")
    assert info.value.field == field


def test_shipped_by_triton_overrides_leave_the_tested_release_alone():
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        spec = load_spec(path, "3.6.0")
        assert all(not t.by_triton for t in spec.targets.values()), path


def test_named_variants_are_full_configs_checked_like_the_default(tmp_path):
    spec = load_spec(write(tmp_path, GOOD_GEMM + "    variants: {wide: {BLOCK_N: 128}, deep: {num_stages: 4}}\n"))
    ts = spec.targets["triton"]
    assert ts.variants == {"wide": {**ts.config, "BLOCK_N": 128}, "deep": {**ts.config, "num_stages": 4}}
    # a template's optional key the default config leaves at the template's default
    spec = load_spec(write(tmp_path, GOOD_GEMM + "    variants: {split: {SPLIT_K: 8}}\n"))
    assert spec.targets["triton"].variants == {"split": {**ts.config, "SPLIT_K": 8}}
    with pytest.raises(SpecError, match="SPLIT_K"):
        load_spec(write(tmp_path, GOOD_GEMM + "    variants: {split: {SPLIT_K: 0}}\n"))


@pytest.mark.parametrize("variants, field, problem", [
    ("{M64: {BLOCK_N: 128}}", "targets.triton.variants.M64", "not a variant name"),
    ("{wide: {BLOCK_Q: 128}}", "targets.triton.variants.wide.BLOCK_Q", "not a config key of the triton GEMM template"),
    ("{wide: {BLOCK_N: 64}}", "targets.triton.variants.wide", "is the default config"),
    ("{a: {BLOCK_N: 128}, b: {BLOCK_N: 128}}", "targets.triton.variants.b", "repeats another variant's config"),
    ("{wide: {BLOCK_N: 96}}", "targets.triton.variants.wide.BLOCK_N", "power of two"),
    ("{wide: 128}", "targets.triton.variants.wide", "expected a mapping"),
    ("[wide]", "targets.triton.variants", "expected a mapping"),
])
def test_bad_named_variants_name_the_field(tmp_path, variants, field, problem):
    err = error_for(tmp_path, GOOD_GEMM + f"    variants: {variants}\n")
    assert err.field == field and problem in err.problem, (err.field, err.problem)


@pytest.mark.parametrize("value, ok", [(32, True), (64, True), (48, False), (8, False), ("32", False)])
def test_the_sm90_backward_rows_a_step_are_a_checked_config_key(tmp_path, value, ok):
    """BWD_BLOCK_M (the sm90 dK/dV kernel's query rows a step, the N of its S^T / dP^T wgmmas) is a known sm90
    attention key: a power of two in [16, 128], else a spec error naming it."""
    path = shipped_with(tmp_path, "attention", ("targets", "sm90", "config", "BWD_BLOCK_M"), value)
    if ok:
        assert load_spec(path).targets["sm90"].config["BWD_BLOCK_M"] == value
        return
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.field == "targets.sm90.config.BWD_BLOCK_M" and "power of two" in info.value.problem


@pytest.mark.parametrize("value", ["static", "clc", "dynamic", 1])
def test_the_sm100_gemm_schedule_is_a_checked_config_key(tmp_path, value):
    """SCHEDULE (sm100 GEMM): "static" anywhere; "clc" only where the installed Triton's Gluon has cluster launch
    control (3.8+), else a spec error that names the field and the by_triton way to ask for it; anything else is
    refused by name."""
    from gen.families.gemm import has_cluster_launch_control

    path = shipped_with(tmp_path, "gemm", ("targets", "sm100", "config", "SCHEDULE"), value)
    if value == "static" or (value == "clc" and has_cluster_launch_control()):
        assert load_spec(path).targets["sm100"].config["SCHEDULE"] == value
        return
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.field == "targets.sm100.config.SCHEDULE"
    assert ("by_triton" in info.value.fix) if value == "clc" else ("static" in info.value.fix)


@pytest.mark.parametrize("over, problem", [
    ({"CTA_PAIR": 1}, None),                                   # the shipped default config, paired
    ({"CTA_PAIR": 2}, "is not 0 or 1"),
    ({"CTA_PAIR": True}, "is not 0 or 1"),
    ({"CTA_PAIR": 1, "SCHEDULE": "clc"}, "static schedule"),
    ({"CTA_PAIR": 1, "BLOCK_N": 64}, "half of B's tile"),
])
def test_the_sm100_gemm_cta_pair_is_a_checked_config_key(tmp_path, over, problem):
    """CTA_PAIR (sm100 GEMM, 2-CTA MMAs): 0 or 1; paired, the static schedule with BLOCK_M 128 and a B tile each CTA
    can take half of; and only where the installed Triton's Gluon has cluster TMEM layouts (3.8+), else a spec error
    that names the field and the by_triton way to ask for it."""
    from gen.families.gemm import has_cluster_launch_control, has_cta_pairs

    if over.get("SCHEDULE") == "clc" and not has_cluster_launch_control():
        pytest.skip("this Triton refuses SCHEDULE clc first")
    config = yaml.safe_load((ROOT / "specs" / "gemm.yaml").read_text())["targets"]["sm100"]["config"]
    path = shipped_with(tmp_path, "gemm", ("targets", "sm100", "config"), {**config, **over})
    if problem is None and has_cta_pairs():
        assert load_spec(path).targets["sm100"].config["CTA_PAIR"] == 1
        return
    with pytest.raises(SpecError) as info:
        load_spec(path)
    if problem is None:   # a release without cluster TMEM layouts
        assert info.value.field == "targets.sm100.config.CTA_PAIR" and "by_triton" in info.value.fix
    else:
        assert problem in info.value.problem and info.value.field.startswith("targets.sm100.config.")


def test_by_triton_variants_ship_only_with_their_releases(tmp_path):
    """A range's `variants:` are named configs of those releases alone, each over the release's config (the spec's,
    then the range's keys): the tested release's spec, identity and variants are untouched."""
    path = _with_by_triton(tmp_path, """
        triton:
          ">=3.8":
            BLOCK_N: 32
            variants: {deep: {num_stages: 4}}
    """)
    old, new = (load_spec(path, v) for v in ("3.6.0", "3.8.0"))
    plain = load_spec(write(tmp_path / "by_triton", GOOD_GEMM, "other.yaml"))
    assert old.targets["triton"].variants == {} and old.sha256 == plain.sha256
    cfg = new.targets["triton"].config
    assert cfg["BLOCK_N"] == 32 and "variants" not in cfg and new.targets["triton"].by_triton == {"BLOCK_N": 32}
    assert new.targets["triton"].variants == {"deep": {**cfg, "num_stages": 4}}


@pytest.mark.parametrize("text, field, problem", [
    ('triton: {">=3.8": {variants: {same: {BLOCK_N: 64}}}}', "triton.variants.same", "is the default config"),
    ('triton: {">=3.8": {variants: [deep]}}', "triton.>=3.8.variants", "expected a mapping"),
    ('triton: {">=3.8": {variants: {deep: {BLOCK_Q: 4}}}}', "triton.variants.deep.BLOCK_Q", "not a config key"),
])
def test_by_triton_variant_errors_name_the_field(tmp_path, text, field, problem):
    with pytest.raises(SpecError) as info:
        load_spec(_with_by_triton(tmp_path, text), "3.8.0")
    assert info.value.field == field and problem in info.value.problem
