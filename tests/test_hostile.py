"""Untrusted bundles and checkpoints, one table: each case edits a copy of the demo bundle the way
an attacker or a careless hand would (re-hashing the manifest so the hash check alone does not
catch it), then `xform run` must exit 1 with a message naming the file and the problem, print no
traceback, and write nothing. docs/cli.md "What xform refuses" lists the same cases."""
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.manifest import MANIFEST, hash_files


def manifest(b):
    return json.loads((b / MANIFEST).read_text())


def rehash(b, m):
    """Write `m` as it is (a typed Manifest could not hold what these tests write), its files rehashed."""
    m["files"] = hash_files(b, set())
    (b / MANIFEST).write_text(json.dumps(m))


def files_key_escapes(b, out):
    m = manifest(b)
    (out / "outside.txt").write_text("secret")
    m["files"]["../outside.txt"] = "0" * 64
    (b / MANIFEST).write_text(json.dumps(m))


def graph_path_absolute(b, out):
    m = manifest(b)
    m["graphs"]["decoder"]["file"] = str(out / "elsewhere.onnx")
    rehash(b, m)


def tokenizer_is_a_symlink_out(b, out):
    shutil.copy(b / "tokenizer.json", out / "tok.json")
    (b / "tokenizer.json").unlink()
    (b / "tokenizer.json").symlink_to(out / "tok.json")
    rehash(b, manifest(b))


def weights_are_a_symlink_out(b, out):
    shutil.copy(b / "decoder.onnx.data", out / "weights.data")
    (b / "decoder.onnx.data").unlink()
    (b / "decoder.onnx.data").symlink_to(out / "weights.data")
    rehash(b, manifest(b))


def external_data_outside(b, out):
    import onnx
    shutil.copy(b / "decoder.onnx.data", b.parent / "outside.data")
    model = onnx.load(str(b / "decoder.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.data"
    onnx.save(model, str(b / "decoder.onnx"))
    rehash(b, manifest(b))


def config(**changes):
    def edit(b, out):
        m = manifest(b)
        m["model"]["config"].update(changes)
        rehash(b, m)
    edit.__name__ = "config_" + "_".join(changes)
    return edit


def signature_edited(b, out):
    m = manifest(b)
    m["graphs"]["decoder"]["signature"]["outputs"][0]["shape"][-1] = 10 ** 9
    rehash(b, m)


def tokenizer(name, edit_fn):
    def edit(b, out):
        tok = json.loads((b / "tokenizer.json").read_text())
        edit_fn(tok)
        (b / "tokenizer.json").write_text(json.dumps(tok))
        rehash(b, manifest(b))
    edit.__name__ = f"tokenizer_{name}"
    return edit


def shared_weight(name, **entry):
    def edit(b, out):
        m = manifest(b)
        m["shared_weights"] = [{"file": "decoder.onnx.data", "offset": 0, "dtype": "float32", "shape": [4, 4],
                                "graphs": {"encoder": "w", "decoder": "w"}, **entry}]
        rehash(b, m)
    edit.__name__ = f"shared_weight_{name}"
    return edit


def old_version(n):
    def edit(b, out):
        m = manifest(b)
        m["version"] = n
        rehash(b, m)
    edit.__name__ = f"version_{n}"
    return edit


def lying_safetensors_header(b, out):
    ref = b / "reference" / "model.safetensors"
    data = ref.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 10 ** 9  # claims a gigabyte more than the file holds
    raw = json.dumps(header).encode()
    ref.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    rehash(b, manifest(b))


CASES = [
    (files_key_escapes, ["--text", "12"], "names the path '../outside.txt', which leads outside the bundle"),
    (graph_path_absolute, ["--text", "12"], "elsewhere.onnx', which leads outside the bundle"),
    (tokenizer_is_a_symlink_out, ["--text", "12"], "tokenizer.json: a symlink"),
    (weights_are_a_symlink_out, ["--text", "12"], "decoder.onnx.data: a symlink"),
    (external_data_outside, ["--text", "12"], "decoder.onnx: ONNX Runtime refuses it"),
    (config(max_len=10 ** 12), ["--text", "12"], "implausible model config: max_len is 1000000000000"),
    (config(d_model=-64), ["--text", "12"], "implausible model config: d_model is -64"),
    (config(eos_id=999), ["--text", "12"], "eos_id is 999, expected an id below tgt_vocab_size"),
    (signature_edited, ["--text", "12"], "the decoder graph's signature is not the one its config implies"),
    (tokenizer("ids_outside_the_vocabulary", lambda t: t["target"]["tokens"].extend(f"x{i}" for i in range(50))), ["--text", "12"],
     "the target vocabulary has 84 ids, but the model's target embedding has 34 rows: ids 34..83 are outside it"),
    (tokenizer("prefix_id_outside", lambda t: t.update(source_prefix=[10 ** 6])), ["--text", "12"], "source_prefix [1000000] must be ids below"),
    (tokenizer("unit_not_a_string", lambda t: t["target"].update(unit=5)), ["--text", "12"],
     "tokenizer.json: tokenizer field 'target.unit' is malformed; expected \"char\", \"word\" or \"spm\", found 5"),
    (tokenizer("spm_path_escapes", lambda t: t.update(source={"unit": "spm", "model": "../../x.model"})), ["--text", "12"],
     "a sentencepiece side names a file in tokenizer/, found '../../x.model'"),
    (shared_weight("past_its_file", shape=[10 ** 6, 512]), ["--text", "12"], "lie outside"),
    (shared_weight("path_escapes", file="../x.data"), ["--text", "12"], "names the path '../x.data', which leads outside"),
    (shared_weight("unknown_graph", graphs={"planner": "w"}), ["--text", "12"], "must map this bundle's graphs"),
    (shared_weight("odd_dtype", dtype="object"), ["--text", "12"], 'dtype "object" is not one of'),
    (old_version(1), ["--text", "12"], "manifest version 1, exported by an earlier xform"),
    (old_version(2), ["--text", "12"], "manifest version 2, exported by an earlier xform whose decoder graph read"),
    (lying_safetensors_header, ["--check"], "model.safetensors: not a readable safetensors file"),
]


@pytest.mark.parametrize("edit, args, fragment", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_hostile_bundle_is_refused(demo_bundle, tmp_path, edit, args, fragment):
    b = tmp_path / "bundle"
    out = tmp_path / "outside"
    out.mkdir()
    shutil.copytree(demo_bundle, b)
    edit(b, out)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    r = CliRunner().invoke(main, ["run", str(b), *args])
    assert r.exit_code == 1, r.output
    assert fragment in r.output, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before  # nothing written


class Payload:
    """Unpickling this runs code: it would create a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    import torch
    torch.save({"model_state_dict": {"w": torch.zeros(2)}, "hook": Payload(marker)}, tmp_path / "evil.pt")
    (tmp_path / "raw.pkl").write_bytes(pickle.dumps(Payload(marker)))
    for name in ("evil.pt", "raw.pkl"):
        r = CliRunner().invoke(main, ["export", str(tmp_path / name), "-o", str(tmp_path / "b"), "--arch", "seed-002",
                                      "--n-heads", "3", "--bos-id", "1", "--eos-id", "2"])
        assert r.exit_code == 1 and f"{name}: holds Python objects besides tensors" in r.output, \
            r.output
        assert "Traceback" not in r.output and "weights_only=False" not in r.output
    assert not marker.exists() and not (tmp_path / "b").exists()
    assert not Path("pwned").exists()


def not_checkpoints(tmp_path):
    import torch
    torch.save({"w": torch.zeros(64)}, tmp_path / "good.pt")
    good = (tmp_path / "good.pt").read_bytes()
    return {"test.src": (b"Ein Mann f\xc3\xa4hrt Fahrrad .\n" * 20, "not a PyTorch checkpoint (a text file)"),
            "photo.pt": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "not a PyTorch checkpoint (a PNG image)"),
            "cut.pt": (good[: len(good) // 2], "not a readable PyTorch checkpoint, truncated or corrupt"),
            "empty.bin": (b"", "not a PyTorch checkpoint (an empty file)"),
            "noise.pth": (bytes(range(7, 256)) * 2, "not a PyTorch checkpoint (binary data of no known kind)")}


def test_a_file_that_is_not_a_checkpoint_gets_one_line(tmp_path):
    """A text file, an image, a truncated or empty file as MODEL: one line saying what it is, never
    torch's unpickling message and its advice to load with weights_only=False."""
    for name, (data, message) in not_checkpoints(tmp_path).items():
        (tmp_path / name).write_bytes(data)
        r = CliRunner().invoke(main, ["export", str(tmp_path / name), "-o", str(tmp_path / "b"),
                                      "--n-heads", "3", "--bos-id", "1", "--eos-id", "2"])
        assert r.exit_code == 1 and f"{name}: {message}" in r.output, (name, r.output)
        # the error is one line; off a terminal, export's stage lines ("[   0.0 s] loading model") come before it
        said = [ln for ln in r.output.strip().splitlines() if not re.match(r"\[ *[\d.]+ s\] ", ln)]
        assert len(said) == 1, r.output
        assert "weights_only" not in r.output and "Traceback" not in r.output
    assert not (tmp_path / "b").exists()
