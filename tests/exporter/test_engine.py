"""TensorRT engines built on this CPU with TensorRT-RTX (it builds ahead of time without a GPU).

Proves the graphs parse and build under a real TensorRT builder with our profiles, that the
engines serialize, and what they record. Running them needs a GPU (tests/runtime/test_trt_backend.py).
"""
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import xform
from tests.conftest import make_model
from xform.cli import main
from xform.contract import signature_for
from xform.errors import BackendUnavailableError, BundleError, XformError
from xform.exporter.engine import BuildOptions, build_engines, profile_ranges
from xform.exporter.export import export_bundle
from xform.manifest import Manifest
from xform.models.checkpoint import save_checkpoint
from xform.runtime.bundle import Bundle

trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, checkpoint_dir):
    root = tmp_path_factory.mktemp("engines")
    return {
        "demo-fp32": export_bundle("demo", root / "demo32").path,
        "demo-fp16": export_bundle("demo", root / "demo16", precision="fp16").path,
        # the tiny seed-002 model: 2 encoder and 3 decoder layers (demo: 3 and 2)
        "tiny-fp32": export_bundle(checkpoint_dir, root / "tiny32").path,
        # seed 004's pre_normed_residual blocks in fp16; seed 003's attention narrower than d_model
        "seed-004-fp16": export_bundle(variant_dir("seed-004", root), root / "s4", precision="fp16").path,
        "seed-003-fp32": export_bundle(variant_dir("seed-003", root), root / "s3").path,
        # the BART family: mBART's embedding LayerNorm and final norms in fp16, M2M100's pre-LN in fp32
        "mbart-fp16": export_bundle(family_dir("mbart", root), root / "mb16", precision="fp16").path,
        "m2m100-fp32": export_bundle(family_dir("m2m_100", root), root / "m2m32").path,
    }


def variant_dir(name, root):
    return save_checkpoint(make_model(name), root / f"ck-{name}")


def family_dir(family, root):
    """A tiny random Hugging Face model of the family, as transformers saves it."""
    transformers = pytest.importorskip("transformers")
    config, model = {"mbart": ("MBartConfig", "MBartForConditionalGeneration"),
                     "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration")}[family]
    cfg = getattr(transformers, config)(vocab_size=45, d_model=32, encoder_layers=1, decoder_layers=2,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=40,
                                        decoder_ffn_dim=40, max_position_embeddings=48)
    getattr(transformers, model)(cfg).save_pretrained(root / f"hf-{family}")
    return root / f"hf-{family}"


@pytest.fixture(scope="module")
def built(bundles):
    out = {}
    for name, path in bundles.items():
        events = []
        engines = build_engines(path, "tensorrt_rtx", max_batch=6, max_new_tokens=20, opt_batch=2, opt_src_len=9,
                                progress=lambda *e: events.append(e))
        out[name] = (path, engines, events)
    return out


@pytest.mark.parametrize("name", ["demo-fp32", "demo-fp16", "tiny-fp32", "seed-004-fp16", "seed-003-fp32",
                                  "mbart-fp16", "m2m100-fp32"])
def test_engines_build_serialize_and_record_the_contract(built, name):
    path, engines, events = built[name]
    bundle = Bundle.open(path)  # engine files are hashed into the manifest
    # the engine entries read back as the builder wrote them: the same JSON
    data = json.loads((path / "manifest.json").read_text())
    assert json.loads(json.dumps(Manifest.from_json(json.loads(json.dumps(data)), "m").to_json())) == data
    cfg = bundle.config.to_dict()
    kv_dtype = "float16" if name.endswith("fp16") else "float32"
    spec = signature_for(cfg, kv_dtype)
    for graph in ("encoder", "decoder", "reorder"):
        e = bundle.manifest.engines[f"{graph}.tensorrt_rtx"]
        assert e == engines[f"{graph}.tensorrt_rtx"]
        assert (path / e.file).stat().st_size == e.details["bytes"] > 10_000
        assert e.onnx_sha256 == bundle.manifest.files[f"{graph}.onnx"]
        assert e.precision == bundle.precision and e.details["strongly_typed"] and e.details["tf32"] is False
        assert e.flavor == "tensorrt_rtx" and e.tensorrt_version == trt.__version__
        io = {t["name"]: t for t in (*e.details["io"]["inputs"], *e.details["io"]["outputs"])}
        for t in (*spec[graph].inputs, *spec[graph].outputs):
            assert io[t.name]["dtype"] == t.dtype, t.name
            assert io[t.name]["shape"] == [-1 if isinstance(a, str) else a for a in t.shape]
        # the reorder engine gathers cross K/V (src_len positions) through its cache axis too
        cache_max = max(20, cfg["max_len"]) if graph == "reorder" else 20
        assert e.profile == {"batch": [1, 2, 6], "src_len": [1, 9, cfg["max_len"]],
                                "cache_len": [1, 10, cache_max], "src_batch": [1, 2, 6]}
    dec = bundle.manifest.engines["decoder.tensorrt_rtx"].details["tensor_profiles"]
    H, D = cfg["n_heads"], cfg.get("attention_head_dim") or cfg["d_model"] // cfg["n_heads"]
    assert dec["cache_key_0"] == [[1, H, 1, D], [2, H, 10, D], [6, H, 20, D]]  # capacity, not the valid length
    assert dec["cross_value_1"] == [[1, H, 1, D], [2, H, 9, D], [6, H, cfg["max_len"], D]]
    assert dec["src_mask"] == [[1, 1], [2, 9], [6, cfg["max_len"]]]
    assert dec["input_ids"] == [[1, 1], [2, 1], [6, 1]]
    assert dec["positions"] == dec["min_new_tokens"] == [[1], [2], [6]]  # one a row: rows at their own positions
    assert sum(1 for k in dec if k.startswith("cache_")) == 2 * cfg["n_decoder_layers"]
    reorder = bundle.manifest.engines["reorder.tensorrt_rtx"].details["tensor_profiles"]
    assert reorder["beam_idx"] == [[1], [2], [6]]
    assert reorder["cache_value_0"] == [[1, H, 1, D], [2, H, 10, D], [6, H, max(20, cfg["max_len"]), D]]
    assert events and all(len(e) == 4 for e in events)  # progress was reported


def test_tf32_and_options_are_applied(bundles, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(bundles["tiny-fp32"], path)
    shutil.rmtree(path / "engines")
    dataclasses.replace(Bundle.open(path, verify=False).manifest, engines={}).write(path)
    engines = build_engines(path, "tensorrt_rtx", options=BuildOptions(tf32=True, workspace_mib=64,
                                                                      builder_optimization_level=1),
                            max_batch=2, max_new_tokens=4)
    e = engines["decoder.tensorrt_rtx"]
    assert e.details["tf32"] is True and e.details["workspace_mib"] == 64
    assert e.details["builder_optimization_level"] == 1 and e.profile["cache_len"] == [1, 2, 4]


def test_existing_engines_need_force(built):
    path, _, _ = built["tiny-fp32"]
    before = (path / "manifest.json").read_text()
    with pytest.raises(BundleError, match="already built; pass --force"):
        build_engines(path, "tensorrt_rtx")
    assert (path / "manifest.json").read_text() == before


@pytest.mark.parametrize("flags, fragments", [
    (dict(max_batch=4, opt_batch=5), ["--opt-batch 5 exceeds --max-batch 4"]),
    (dict(max_src_len=41), ["--max-src-len 41 exceeds the model's max_len 40"]),
    (dict(max_new_tokens=50, max_batch=0), ["--max-new-tokens 50 exceeds", "--max-batch must be at least 1"]),
    (dict(max_src_len=8, opt_src_len=9), ["--opt-src-len 9 exceeds --max-src-len 8"]),
])
def test_inconsistent_profiles_are_refused(flags, fragments):
    with pytest.raises(XformError) as e:
        profile_ranges(40, **flags)
    for f in fragments:
        assert f in str(e.value)


def test_bundle_failing_its_hashes_is_refused(bundles, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(bundles["tiny-fp32"], path)
    with open(path / "decoder.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match="decoder.onnx: sha256"):
        build_engines(path, "tensorrt_rtx", force=True)


def test_standard_tensorrt_missing_or_without_gpu_is_refused(bundles):
    try:
        import tensorrt  # noqa: F401
        match = "builds engines on an NVIDIA GPU and this machine has none"
    except ImportError:
        match = r"no TensorRT installed .*pip install 'tensorrt>=10.12'"
    from xform.runtime.backends.gpu import gpu_info
    if gpu_info() is not None:
        pytest.skip("this machine has a GPU: tensorrt may build here")
    with pytest.raises(BackendUnavailableError, match=match):
        build_engines(bundles["tiny-fp32"], "tensorrt", force=True)


def test_trt_backend_refusals_without_a_gpu(built, tmp_path):
    from xform.runtime.backends.gpu import gpu_info
    path, _, _ = built["tiny-fp32"]
    if gpu_info() is None:
        with pytest.raises(BackendUnavailableError, match="needs an NVIDIA GPU"):
            xform.load(path, backend="trt")
    with pytest.raises(XformError, match="use device cuda"):
        xform.load(path, backend="trt", device="cpu")
    # an engine recorded as built from another ONNX is refused before anything runs
    copy = tmp_path / "b"
    shutil.copytree(path, copy)
    m = Bundle.open(copy, verify=False).manifest
    m.engines["decoder.tensorrt_rtx"] = dataclasses.replace(m.engines["decoder.tensorrt_rtx"], onnx_sha256="0" * 64)
    m.write(copy)
    with pytest.raises(BundleError, match="built from another decoder.onnx"):
        xform.load(copy, backend="trt")


def test_trt_backend_needs_engines(bundles, tmp_path):
    path = tmp_path / "b"
    export_bundle(bundles["tiny-fp32"] / "reference", path)
    with pytest.raises(BundleError, match="no TensorRT engines; build them with: xform build-engine"):
        xform.load(path, backend="trt")


def test_cli_build_engine(tmp_path, checkpoint_dir):
    path = export_bundle(checkpoint_dir, tmp_path / "b").path
    r = CliRunner().invoke(main, ["build-engine", str(path), "--flavor", "tensorrt_rtx", "--max-batch", "3",
                                  "--max-new-tokens", "10", "--builder-opt-level", "0"])
    assert r.exit_code == 0, r.output
    assert re.search(r"encoder\.tensorrt_rtx\.[0-9a-f]{12}\.engine", r.output) and "cache_len [1, 5, 10]" in r.output
    first = sorted(p.name for p in (path / "engines").iterdir())
    r = CliRunner().invoke(main, ["build-engine", str(path), "--flavor", "tensorrt_rtx"])
    assert r.exit_code == 1 and "already built" in r.output
    # beams: the profile's batch holds sources x beams
    r = CliRunner().invoke(main, ["build-engine", str(path), "--flavor", "tensorrt_rtx", "--max-batch", "3",
                                  "--max-beams", "4", "--max-new-tokens", "10", "--builder-opt-level", "0", "--force"])
    assert r.exit_code == 0, r.output
    assert "batch [1, 3, 12]" in r.output and re.search(r"reorder\.tensorrt_rtx\.[0-9a-f]{12}\.engine", r.output)
    # the rebuilt engines have new names; the replaced ones are gone and the bundle passes its hashes
    after = sorted(p.name for p in (path / "engines").iterdir())
    assert len(after) == 3 and not set(after) & set(first)
    e = Bundle.open(path).manifest.engines["reorder.tensorrt_rtx"]
    assert e.max_beams == 4 and e.max_sources == 3 and e.details["tensor_profiles"]["beam_idx"][2] == [12]
    dec = Bundle.open(path).manifest.engines["decoder.tensorrt_rtx"].details["tensor_profiles"]
    assert dec["input_ids"][2] == [12, 1] and dec["cross_key_0"][2][0] == 3  # rows: sources x beams; cross: sources
    r = CliRunner().invoke(main, ["build-engine", str(path), "--max-beams", "0", "--force"])
    assert r.exit_code == 1 and "--max-beams must be at least 1" in r.output
    r = CliRunner().invoke(main, ["build-engine", str(path), "--force", "--max-src-len", "999"])
    assert r.exit_code == 1 and "exceeds the model's max_len" in r.output


def test_trt_backend_without_tensorrt_says_so_before_engines(bundles, tmp_path, monkeypatch):
    """No TensorRT is the first thing missing: named with the install line, not 'no engines'."""
    path = tmp_path / "b"
    export_bundle(bundles["tiny-fp32"] / "reference", path)  # no engines either
    for name in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    with pytest.raises(BackendUnavailableError, match=r"needs TensorRT, and none is installed .use backend ort"):
        xform.load(path, backend="trt")


def test_built_engines_of_a_flavour_not_installed_are_named(built, monkeypatch):
    path, _, _ = built["tiny-fp32"]  # tensorrt_rtx engines
    from xform.runtime.backends.trt_backend import pick_engines
    with pytest.raises(BackendUnavailableError, match="has tensorrt_rtx engines, but this Python has only tensorrt"):
        pick_engines(Bundle.open(path), "auto", ["tensorrt"])


def test_the_tensorrt_install_hint_agrees_with_the_readme():
    """Each install line the hint gives is the README's, CUDA versions included, and the extras
    the README names hold what the hint says."""
    import tomllib

    from xform.runtime.backends.gpu import TRT_INSTALL_HINT
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "pip install 'tensorrt-cu12>=10.12' 'cuda-bindings>=12.6,<13' (CUDA 12)" in TRT_INSTALL_HINT
    assert "CUDA 12: `pip install -e . 'tensorrt-cu12>=10.12' 'cuda-bindings>=12.6,<13'`" in readme
    assert "pip install 'tensorrt>=10.12' 'cuda-bindings>=12.6' (CUDA 13)" in TRT_INSTALL_HINT
    assert 'CUDA 13: `pip install -e ".[tensorrt]"`' in readme and extras["tensorrt"] == ["tensorrt>=10.12", "cuda-bindings>=12.6"]
    assert "'tensorrt-rtx>=1.0' 'cuda-bindings>=12.6' (CUDA 13; tensorrt-rtx-cu12 for CUDA 12" in TRT_INSTALL_HINT
    assert "(CUDA 13; `tensorrt-rtx-cu12` for CUDA 12)" in readme
    assert extras["tensorrt-rtx"] == ["tensorrt-rtx>=1.0", "cuda-bindings>=12.6"]


def test_explicit_ranges_are_recorded_as_built(bundles, tmp_path):
    """max_sources / max_beams in the manifest come from the ranges built, also when they are
    given as ProfileRanges rather than as flags (they were read from the flags alone)."""
    from xform.exporter.engine import ProfileRanges
    path = tmp_path / "b"
    export_bundle(bundles["tiny-fp32"] / "reference", path)
    ranges = ProfileRanges(batch=(1, 4, 8), src_len=(1, 6, 12), cache_len=(1, 8, 16), src_batch=(1, 1, 2))
    build_engines(path, "tensorrt_rtx", ranges=ranges, options=BuildOptions(builder_optimization_level=0))
    e = Bundle.open(path).manifest.engines["decoder.tensorrt_rtx"]
    assert (e.max_sources, e.max_beams) == (2, 4)


def test_cleanup_removes_only_engine_files_builds_write(built, tmp_path):
    """Engines a rebuild replaced or a killed build left go; a file of the user's that merely ends
    in .engine stays (build-engine --force deletes nothing it did not write)."""
    from xform.exporter.engine import remove_unreferenced_engines
    from xform.manifest import Manifest

    path = tmp_path / "b"
    shutil.copytree(built["tiny-fp32"][0], path)
    stale = path / "engines" / "decoder.tensorrt_rtx.0123456789ab.engine"
    stale.write_bytes(b"left by a killed build")
    mine = path / "engines" / "my-tuned.engine"
    mine.write_bytes(b"the user's")
    remove_unreferenced_engines(path / "engines", Manifest.read(path / "manifest.json"))
    assert not stale.exists() and mine.read_bytes() == b"the user's"
    assert all((path / e.file).is_file() for e in Manifest.read(path / "manifest.json").engines.values())
