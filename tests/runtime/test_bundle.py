"""A bundle is refused when its manifest or files are not what export wrote."""
import json
import shutil

import pytest

import xform
from xform.errors import BundleError


@pytest.fixture
def copy(tiny_bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(tiny_bundle, dst)
    return dst


def edit_manifest(path, **changes):
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    (path / "manifest.json").write_text(json.dumps(m))


def test_missing_directory_and_manifest(tmp_path):
    with pytest.raises(BundleError, match="not a directory"):
        xform.load(tmp_path / "nope")
    with pytest.raises(BundleError, match="manifest.json: missing"):
        xform.load(tmp_path)


def test_corrupt_manifest(copy):
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="corrupt manifest"):
        xform.load(copy)


def test_unknown_manifest_version(copy):
    edit_manifest(copy, version=99)
    with pytest.raises(BundleError, match="manifest version 99 is not one this xform knows"):
        xform.load(copy)


@pytest.mark.parametrize("old", [1, 2, 3])
def test_bundles_of_an_older_contract_are_refused_with_the_re_export_line(copy, old):
    """Version 3 decoded every row at one position: its decoder has no per-row `positions`."""
    edit_manifest(copy, version=old)
    with pytest.raises(BundleError, match=rf"manifest version {old}, exported by an earlier xform .* re-export it"):
        xform.load(copy)


def test_not_an_xform_manifest(copy):
    edit_manifest(copy, format="something-else")
    with pytest.raises(BundleError, match="not an xform manifest"):
        xform.load(copy)


def test_hash_mismatch(copy):
    data = bytearray((copy / "decoder.onnx").read_bytes())
    data[-1] ^= 0xFF
    (copy / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder.onnx: sha256 .* does not match the manifest"):
        xform.load(copy)


def test_missing_file(copy):
    (copy / "encoder.onnx").unlink()
    with pytest.raises(BundleError, match="encoder.onnx: missing"):
        xform.load(copy)


def test_tampered_external_weights(copy):
    with open(copy / "encoder.onnx.data", "r+b") as f:
        f.seek(100)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(BundleError, match=r"encoder.onnx.data: sha256 .* does not match"):
        xform.load(copy)
