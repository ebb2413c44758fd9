"""The typed manifest (xform/manifest.py): one definition reads, validates and writes it.

A real bundle's manifest round-trips to the same JSON (the format is unchanged); every field of
the wrong type or value is refused naming the field, never a TypeError from deep inside; a
hostile config is refused by the one config validation (TransformerConfig.problems)."""
import copy
import json
from pathlib import Path

import pytest

from xform.config import TransformerConfig
from xform.contract import DECODER, cache_dtype, signature_for
from xform.errors import BundleError, ConfigError
from xform.manifest import MANIFEST, VERSION, Manifest, hash_files


def raw(bundle):
    return json.loads((bundle / MANIFEST).read_text())


def test_a_bundles_manifest_round_trips_to_the_same_json(demo_bundle, tmp_path):
    data = raw(demo_bundle)
    m = Manifest.from_json(copy.deepcopy(data), "test")
    assert json.loads(json.dumps(m.to_json())) == data
    assert m.version == VERSION and m.config == TransformerConfig.from_dict(data["model"]["config"])
    assert m.kv_dtype == "float32" == cache_dtype(m.graphs[DECODER].signature)
    assert m.tokenizer is not None and m.tokenizer.file == "tokenizer.json"
    # written again, its files hashed as they are: the same bytes on disk
    out = tmp_path / "b"
    import shutil
    shutil.copytree(demo_bundle, out)
    m.write(out)
    assert raw(out) == data and m.files == hash_files(out, set())


SHARED = {"file": "decoder.onnx.data", "offset": 8, "dtype": "float16", "shape": [5, 3],
          "graphs": {"encoder": "emb", "decoder": "emb.1"}}
# a manifest written by xform 0.4.0 before the typed manifest (f974c19): Marian Transformer-base,
# its embedding table shared by the encoder and decoder graphs
OLD = Path(__file__).parent / "data" / "manifest_0.4.0_marian_base.json"


def with_shared(bundle):
    """The bundle's manifest with one shared weight (the tiny model's tables are below the 1 MiB
    that export shares)."""
    data = raw(bundle)
    data["shared_weights"] = [dict(SHARED)]
    return data


def test_a_manifest_written_before_the_typed_one_round_trips(tmp_path):
    """The layout is format 4's as the old writer wrote it: read and written back, the same JSON."""
    data = json.loads(OLD.read_text())
    assert data["shared_weights"] and data["version"] == 4
    m = Manifest.from_json(copy.deepcopy(data), str(OLD))
    assert json.loads(json.dumps(m.to_json())) == data
    (w,) = m.shared_weights
    assert w.nbytes == 32000 * 512 * 4 and w.graphs == {"encoder": "model.src_embed.weight",
                                                        "decoder": "model.src_embed.weight"}


def test_keys_of_a_later_writer_are_kept(demo_bundle):
    data = raw(demo_bundle)
    data["quantization_notes"] = {"by": "a later xform 0.4.x"}
    m = Manifest.from_json(copy.deepcopy(data), "m.json")
    assert m.extra == {"quantization_notes": {"by": "a later xform 0.4.x"}}
    assert json.loads(json.dumps(m.to_json())) == data


def test_the_shared_weights_entries_are_typed(tiny_bundle):
    m = Manifest.from_json(with_shared(tiny_bundle), "m.json")
    (w,) = m.shared_weights
    assert (w.file, w.offset, w.dtype, w.shape, w.graphs) == ("decoder.onnx.data", 8, "float16", (5, 3),
                                                              {"encoder": "emb", "decoder": "emb.1"})
    assert w.nbytes == 30 and w.end == 38 and w.to_json() == SHARED
    assert "decoder.onnx.data" in m.named_files()


def edit(path, value):
    """Set the manifest field at dotted `path` (None deletes it)."""
    def apply(data):
        *parents, last = path.split(".")
        for p in parents:
            data = data[int(p)] if isinstance(data, list) else data[p]
        if value is None:
            del data[last]
        else:
            data[last] = value
    return apply


CASES = [
    ("format", "onnx-bundle", "not an xform manifest"),
    ("version", 5, "manifest version 5 is not one this xform knows [4]"),
    ("version", True, "manifest version True is not one"),
    ("version", 4.0, "manifest version 4.0 is not one"),
    ("version", 3, "manifest version 3, exported by an earlier xform"),
    ("precision", "fp8", "manifest.precision must be one of ['fp32', 'fp16', 'int8'], found \"fp8\""),
    ("opset", "17", 'manifest.opset must be an integer in [7, 99], found "17"'),
    ("attention_layer", 7, "manifest.attention_layer must be an integer in [0, 1] or null, found 7"),
    ("attention_layer", True, "manifest.attention_layer must be an integer"),
    ("graphs.decoder.file", 3, "graphs.decoder.file must be a non-empty string, found 3"),
    ("graphs.decoder.signature", [], "graphs.decoder.signature must be an object, found []"),
    ("graphs.decoder.signature.inputs", [{"name": "x"}], "malformed signature of the decoder graph"),
    ("graphs.reorder", None, "no reorder graph; re-export the bundle"),
    ("graphs.planner", {"file": "p.onnx", "signature": {"inputs": [], "outputs": []}}, "unknown graphs ['planner']"),
    ("model.config.d_model", 96, "graph's signature is not the one its config implies"),
    ("model.config.max_len", None, "implausible model config: model.config: missing TransformerConfig keys ['max_len']"),
    ("model.config.rotary", True, "unknown TransformerConfig keys ['rotary']"),
    ("model.config.positions", 5, "positions must be one of"),
    ("model.config.dropout", "0.1", "dropout must be in [0, 1), got '0.1'"),
    ("model.config.banned_ids", [{}], "banned_ids must be a tuple of ids below tgt_vocab_size"),
    ("model.config.tie_output", "yes", "tie_output must be true or false, got 'yes'"),
    ("model.config", [], "model.config must be an object, found []"),
    ("model.source", "hub", 'model.source must be an object, found "hub"'),
    ("reference", None, "manifest.reference must be an object, found null"),
    ("reference.dir", "", 'reference.dir must be a non-empty string, found ""'),
    ("tokenizer.notes", [1], "tokenizer.notes must be a list of strings"),
    ("tokenizer.file", None, "tokenizer.file must be a non-empty string"),
    ("output_table", {"file": "output.safetensors"}, "the decoder_restricted graph and output_table go together"),
    ("generation", [], "manifest.generation must be an object or null, found []"),
    ("generation.max_length", "512", 'generation.max_length must be an integer in [0, 2147483648] or null, found "512"'),
    ("generation.forced_bos_token_id", 34, "generation.forced_bos_token_id must be an integer in [0, 33] or null"),
    ("engines", [], "manifest.engines must be an object, found []"),
    ("engines", {"decoder.tensorrt": {"file": "engines/d.engine"}}, "engines.decoder.tensorrt.profile must be an object"),
    ("engines", {"decoder.tensorrt": {"profile": {"batch": [1, 8, 4], "src_len": [1, 2, 3], "cache_len": [1, 2, 3]}}},
     "engines.decoder.tensorrt.profile.batch must be [min, opt, max], sizes in [1, 2^31] in that order, found [1, 8, 4]"),
    ("engines", {"decoder.tensorrt": {"profile": {"batch": [1, 2, 4], "src_len": [1, 2, 3], "cache_len": [1, 2, 3]}}},
     "engines.decoder.tensorrt.file must be a non-empty string, found null"),
    ("files", {"encoder.onnx": 1}, "manifest.files must be an object of strings"),
    ("versions", None, None),  # optional: an empty record
    ("shared_weights", {}, "manifest.shared_weights must be a list"),
    ("shared_weights.0.dtype", "object", 'shared_weights[0].dtype "object" is not one of'),
    ("shared_weights.0.shape", [0, 4], "implausible shape [0, 4]"),
    ("shared_weights.0.offset", -1, "shared_weights[0].offset must be an integer in [0, "),
    ("shared_weights.0.graphs", {"planner": "w"}, "must map this bundle's graphs to initializer names"),
]


@pytest.mark.parametrize("path, value, fragment", CASES, ids=[f"{c[0]}={c[1]!r}" for c in CASES])
def test_each_field_is_checked_and_named(demo_bundle, path, value, fragment):
    data = with_shared(demo_bundle)
    edit(path, value)(data)
    if fragment is None:
        assert Manifest.from_json(data, "m.json").versions == {}
        return
    with pytest.raises(BundleError) as e:
        Manifest.from_json(data, "m.json")
    assert str(e.value).startswith("m.json") and fragment in str(e.value), str(e.value)


def test_the_config_is_validated_once_for_models_and_manifests():
    """TransformerConfig.problems is the check both take: each hostile value gives a problem, not
    an exception from comparing a string with a number, and sizes beyond any real model's are
    refused for a model built in PyTorch too."""
    with pytest.raises(ConfigError) as e:
        TransformerConfig(src_vocab_size=37, tgt_vocab_size=41, d_model=48, n_heads=3, dropout="x",
                          layer_norm_eps=None, positions=["sinusoidal"], eos_id="2", banned_ids=(1.5,))
    msg = str(e.value)
    for part in ("dropout must be in [0, 1), got 'x'", "layer_norm_eps must be in (0, 1), got None",
                 "positions must be one of", "eos_id is '2', expected a non-negative integer", "banned_ids must be"):
        assert part in msg, msg
    with pytest.raises(ConfigError, match=r"max_len is 2097152, expected an integer in \[1, 1048576\]"):
        TransformerConfig(src_vocab_size=37, tgt_vocab_size=41, d_model=48, n_heads=3, max_len=1 << 21)


def test_the_signature_follows_the_kv_dtype(tiny_bundle):
    """An fp16 signature (float16 cache) checks against the config with that dtype: the dtype is
    read from the decoder's cache input, by name from the contract, not a literal."""
    data = raw(tiny_bundle)
    m = Manifest.from_json(data, "m.json")
    specs = signature_for(m.config_dict, "float16")
    data["graphs"] = {g: {"file": e["file"], "signature": specs[g].to_dict()} for g, e in data["graphs"].items()}
    assert Manifest.from_json(data, "m.json").kv_dtype == "float16"
    data["graphs"]["encoder"]["signature"] = signature_for(m.config_dict, "float32")["encoder"].to_dict()
    with pytest.raises(BundleError, match="the encoder graph's signature is not the one its config implies"):
        Manifest.from_json(data, "m.json")
