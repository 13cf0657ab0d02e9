"""The typed build record (gen/build/build_record.py): what carries over between builds, what measurements replace, that
the committed manifests are exactly its JSON, and that a build writes manifest.json once."""
import json
from pathlib import Path
from types import SimpleNamespace

from gen.build.build_record import CARRIED_OVER, BuildRecord, VariantRecord, assemble

from .conftest import ROOT


def test_committed_manifests_are_the_records_json_byte_for_byte():
    for family in ("gemm", "attention"):
        path = ROOT / "generated" / family / "manifest.json"
        record = BuildRecord.from_json(json.loads(path.read_text()))
        assert json.dumps(record.to_json(), indent=1) + "\n" == path.read_text(), family
        assert record.shipped() and all(isinstance(v, VariantRecord) for v in record.variants)


class _Report:
    case, ok, smem_bytes, regs, spills, prologue_spills, hot_reloads = {"dtype": "bfloat16"}, True, 1024, 128, 0, 0, 0

    def to_manifest(self):
        return {"smem_bytes": self.smem_bytes, "regs": self.regs, "spills": self.spills}

    def failures(self):
        return []


def _variant(name: str, target: str, config_digest: str):
    source = SimpleNamespace(template=f"{target}/gemm.py.jinja", template_digest="t" * 64, config_digest=config_digest)
    return SimpleNamespace(name=name, target=target, config={"BLOCK_M": 128}, source=source, ok=True,
                           reports=[_Report()])


def _result(sha: str, *variants):
    spec = SimpleNamespace(family="gemm", op="gemm", sha256=sha)
    return SimpleNamespace(spec=spec, variants=list(variants), rejected=[])


def _previous(sha: str) -> BuildRecord:
    record = assemble(_result(sha, _variant("sm90", "sm90", "a"), _variant("sm90_m64", "sm90", "b")),
                      "specs/gemm.yaml", {"triton": "3.6.0"}, None)
    record.add_measurements({name: {"verify": {"device": "NVIDIA H200", "cases": 3, "max_rel_err": 1e-3, "ok": True},
                                    "decision": "kept"} for name in ("sm90", "sm90_m64")})
    record.add_precompiled({"sm90": {"ok": True, "kernels": 2}, "sm90_m64": {"ok": True, "kernels": 2}})
    record.tuning, record.inductor = {"device": "NVIDIA H200"}, {"markdown": "side by side"}
    return record


def test_measurements_carry_over_only_to_variants_built_from_the_same_digests():
    previous = _previous("s1")
    # sm90_m64's config changed (new config digest): what was measured for the old config must not follow it
    record = assemble(_result("s1", _variant("sm90", "sm90", "a"), _variant("sm90_m64", "sm90", "CHANGED")),
                      "specs/gemm.yaml", {"triton": "3.6.0"}, previous)
    kept, changed = record.variant("sm90"), record.variant("sm90_m64")
    assert kept.runs == "verified on NVIDIA H200" and kept.verify["ok"] and kept.decision == "kept"
    assert kept.precompiled == {"ok": True, "kernels": 2} and kept.carried_over == CARRIED_OVER
    assert changed.runs == "compiled" and changed.verify is None and changed.precompiled is None
    assert changed.carried_over is None
    assert record.tuning == {"device": "NVIDIA H200"} and record.inductor == {"markdown": "side by side"}


def test_a_spec_edit_carries_no_measurement_and_no_tuning():
    record = assemble(_result("s2", _variant("sm90", "sm90", "a")), "specs/gemm.yaml", {}, _previous("s1"))
    assert record.variant("sm90").verify is None and record.tuning is None
    assert "verify" not in record.variant("sm90").to_json()   # never measured: absent, not null


def test_fresh_measurements_replace_carried_ones():
    record = assemble(_result("s1", _variant("sm90", "sm90", "a")), "specs/gemm.yaml", {}, _previous("s1"))
    record.add_measurements({"sm90": {"verify": {"device": "NVIDIA H100", "cases": 4, "max_rel_err": 2e-3,
                                                 "ok": True}}})
    v = record.variant("sm90")
    assert v.runs == "verified on NVIDIA H100" and v.verify["cases"] == 4 and v.carried_over is None


def test_a_target_subset_build_keeps_the_other_targets_entries():
    previous = _previous("s1")
    previous.variants.append(VariantRecord(target="triton", name="triton", module="generated.gemm.triton", config={},
                                           template="triton/gemm.py.jinja", template_digest="x", config_digest="y",
                                           compile={"ok": True}, runs="compiled"))
    record = assemble(_result("s1", _variant("sm90", "sm90", "a")), "specs/gemm.yaml", {}, previous,
                      keep_other_targets=True)
    assert [v.name for v in record.variants] == ["sm90", "triton"]


def test_a_build_writes_its_manifest_once(tmp_path, monkeypatch):
    """The record is assembled in memory; manifest.json and REPORT.md are written once, at the end."""
    import gen.__main__ as cli

    writes = []
    real = Path.write_text

    def counting(self, text, *a, **k):
        if self.name in ("manifest.json", "REPORT.md"):
            writes.append(self.name)
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", counting)
    assert cli.main(["specs/gemm.yaml", "--target", "triton", "--no-search", "--no-gpu",
                     "--quiet", "--out", str(tmp_path)]) == 0
    assert sorted(writes) == ["REPORT.md", "manifest.json"]
    from gen.runtime.triton_range import installed, release_folder

    # another Triton release builds its own folder of the package (gen.build.emit.emit_release)
    written = json.loads((tmp_path / "gemm" / (release_folder(installed()) or "") / "manifest.json").read_text())
    assert [v["name"] for v in written["variants"]] == ["triton", "triton_splitk"]   # the target's named config too
