"""Golden rendered sources: a template change shows up as a reviewed diff. Regenerate with --update-golden."""
import shutil

import jinja2
import pytest

from gen.build.render import render_variant, template_digest
from gen.build.spec import load_spec

from .conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
CASES = [(family, target) for family in ("gemm", "attention") for target in ("sm100", "sm90", "triton")]
# the spec's named configs whose template branches the defaults do not render
NAMED = [("gemm", "sm90", "swap16"), ("gemm", "triton", "splitk"), ("attention", "triton", "splitkv"),
         ("gemm", "sm100", "pair")]   # pair: a named config of triton >= 3.8 only (specs/by_triton/gemm.yaml)


@pytest.mark.parametrize("family, target, variant", [c + (None,) for c in CASES] + NAMED)
def test_rendered_source_matches_golden(family, target, variant, update_golden):
    spec = load_spec(ROOT / "specs" / f"{family}.yaml")
    tspec = spec.targets[target]
    if variant and variant not in tspec.variants:
        pytest.skip(f"{target}_{variant} is not a config of this Triton's build")
    text = render_variant(spec, target, tspec.variants[variant] if variant else tspec.config).text
    compile(text, f"{family}/{target}.py", "exec")  # renders to valid Python
    # a config this Triton takes from specs/by_triton/ renders its own golden, named by what it overrides
    overrides = "".join(f".{k}={v}" for k, v in sorted(tspec.by_triton.items()))
    path = GOLDEN / family / f"{target}{'_' + variant if variant else ''}{overrides}.py"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run pytest --update-golden"
    assert text == path.read_text(), f"{family}/{target} rendering changed; review and run pytest --update-golden"


def test_missing_config_key_fails_loudly():
    spec = load_spec(ROOT / "specs" / "gemm.yaml")
    cfg = dict(spec.targets["sm90"].config)
    del cfg["BLOCK_K"]
    with pytest.raises(jinja2.UndefinedError):
        render_variant(spec, "sm90", cfg)


def _templates_with(tmp_path, changed: str):
    """A copy of templates/ with one file changed (a comment appended)."""
    fake = tmp_path / "templates"
    shutil.copytree(ROOT / "templates", fake)
    path = fake / changed
    path.write_text(path.read_text() + "\n{# changed #}\n")
    return fake


@pytest.mark.parametrize("changed, template, moves", [
    ("_lib/pipeline.jinja", "sm90/gemm.py.jinja", True),        # imported: the digest follows it
    ("_lib/score_math.jinja", "sm90/attention.py.jinja", True),
    ("_lib/score_math.jinja", "sm90/gemm.py.jinja", False),     # not imported by the GEMM: its bundles stay keyed
    ("_lib/score_math.jinja", "triton/gemm.py.jinja", False),
    ("sm100/gemm.py.jinja", "sm90/gemm.py.jinja", False),
])
def test_template_digest_follows_the_macros_a_template_imports(tmp_path, monkeypatch, changed, template, moves):
    import gen.build.render as render

    before = template_digest(template)
    monkeypatch.setattr(render, "TEMPLATE_DIR", _templates_with(tmp_path, changed))
    assert (template_digest(template) != before) == moves


def test_template_sources_are_what_jinja_imports():
    from gen.build.render import template_sources

    assert template_sources("sm90/gemm.py.jinja") == [
        "_lib/compat.jinja", "_lib/gemm_residual.jinja", "_lib/pipeline.jinja", "_lib/runtime_import.jinja",
        "sm90/gemm.py.jinja"]
    assert "_lib/score_math.jinja" in template_sources("sm100/attention.py.jinja")
    assert template_sources("triton/gemm.py.jinja") == ["_lib/runtime_import.jinja", "triton/gemm.py.jinja"]


def test_sm90_and_sm100_share_the_ring_protocol():
    spec = load_spec(ROOT / "specs" / "gemm.yaml")
    for target in ("sm90", "sm100"):
        text = render_variant(spec, target, spec.targets[target].config).text
        assert "def producer_acquire(empty_bars, counter, NUM_SLOTS: gl.constexpr):" in text
        assert "def consumer_wait(ready_bars, counter, NUM_SLOTS: gl.constexpr):" in text
