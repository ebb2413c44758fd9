"""xform triton writes a Triton model: its config, model.py and the bundle, atomically."""
import json

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.errors import BundleError, XformError
from xform.serving.repository import ModelOptions, write_model


def test_repository_layout_and_config(demo_bundle, tmp_path):
    path = write_model(demo_bundle, tmp_path / "repo", ModelOptions(max_batch=4, max_queue_delay_us=500, instances=2,
                                                                    scheduling="dynamic"))
    assert path == tmp_path / "repo" / "demo"
    cfg = (path / "config.pbtxt").read_text()
    for line in ('name: "demo"', 'backend: "python"', "max_batch_size: 4",
                 "dynamic_batching { max_queue_delay_microseconds: 500 }",
                 '{ name: "text" data_type: TYPE_STRING dims: [ 1 ] optional: true }',
                 '{ name: "src_ids" data_type: TYPE_INT64 dims: [ -1 ] optional: true allow_ragged_batch: true }',
                 '{ name: "max_new_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }',
                 '{ name: "num_beams" data_type: TYPE_INT32 dims: [ 1 ] optional: true }',
                 '{ name: "output_ids" data_type: TYPE_INT64 dims: [ -1 ] }',
                 '{ name: "translation" data_type: TYPE_STRING dims: [ 1 ] }',
                 "instance_group [ { count: 2 kind: KIND_CPU } ]",
                 'parameters { key: "bundle" value: { string_value: "bundle" } }',
                 'parameters { key: "backend" value: { string_value: "ort" } }',
                 'parameters { key: "device" value: { string_value: "cpu" } }'):
        assert line in cfg, line
    assert "class TritonPythonModel" in (path / "1" / "model.py").read_text()
    copied = json.loads((path / "1" / "bundle" / "manifest.json").read_text())
    assert copied == json.loads((demo_bundle / "manifest.json").read_text())
    assert not [p for p in (tmp_path / "repo").iterdir() if p.name.startswith(".")]  # no temporary left


def test_reference_no_batching_and_a_second_model_beside(demo_bundle, tiny_bundle, tmp_path):
    write_model(demo_bundle, tmp_path / "repo", ModelOptions(dynamic_batching=False), reference=True)
    write_model(tiny_bundle, tmp_path / "repo", ModelOptions(name="tiny-ids", threads=1))
    demo = (tmp_path / "repo" / "demo" / "config.pbtxt").read_text()
    assert f'string_value: "{demo_bundle.resolve()}"' in demo and "dynamic_batching" not in demo
    assert not (tmp_path / "repo" / "demo" / "1" / "bundle").exists()
    tiny = (tmp_path / "repo" / "tiny-ids-stream" / "config.pbtxt").read_text()  # the in-flight engine
    assert "translation" not in tiny and 'key: "threads" value: { string_value: "1" }' in tiny


def test_inflight_writes_a_front_and_a_decoupled_engine(demo_bundle, tmp_path):
    """The default on ort: NAME relays plain requests to NAME-stream, which is decoupled, holds
    the bundle (the front holds none) and the running batch's limits, and takes `stream`."""
    path = write_model(demo_bundle, tmp_path / "repo", ModelOptions(max_rows=12, max_queue=5, instances=2))
    front, engine = (tmp_path / "repo" / n / "config.pbtxt" for n in ("demo", "demo-stream"))
    front, engine = front.read_text(), engine.read_text()
    for line in ('parameters { key: "role" value: { string_value: "front" } }',
                 'parameters { key: "engine" value: { string_value: "demo-stream" } }',
                 "instance_group [ { count: 1 kind: KIND_CPU } ]", '{ name: "translation" data_type: TYPE_STRING'):
        assert line in front, line
    assert "model_transaction_policy" not in front and 'name: "stream"' not in front
    assert not (path / "1" / "bundle").exists()
    for line in ('name: "demo-stream"', "model_transaction_policy { decoupled: true }",
                 '{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
                 'parameters { key: "role" value: { string_value: "engine" } }',
                 'parameters { key: "max_rows" value: { string_value: "12" } }',
                 'parameters { key: "max_queue" value: { string_value: "5" } }',
                 "instance_group [ { count: 2 kind: KIND_CPU } ]"):
        assert line in engine, line
    assert (tmp_path / "repo" / "demo-stream" / "1" / "bundle" / "manifest.json").is_file()
    # where in-flight cannot run, the default is dynamic; asking for it there is refused by name
    assert ModelOptions(backend="trt").mode == ModelOptions(vocab_map=tmp_path).mode == "dynamic"
    with pytest.raises(XformError, match="--scheduling inflight runs on --backend ort"):
        write_model(demo_bundle, tmp_path / "r2", ModelOptions(backend="trt", scheduling="inflight"))
    with pytest.raises(XformError, match="--max-rows must be >= 1"):
        write_model(demo_bundle, tmp_path / "r2", ModelOptions(max_rows=0))


def test_refusals(demo_bundle, tmp_path):
    write_model(demo_bundle, tmp_path / "repo")
    with pytest.raises(BundleError, match="already exists; pass --force"):
        write_model(demo_bundle, tmp_path / "repo")
    write_model(demo_bundle, tmp_path / "repo", force=True)
    with pytest.raises(BundleError, match="has no TensorRT engines; run `xform build-engine"):
        write_model(demo_bundle, tmp_path / "r2", ModelOptions(backend="trt"))
    with pytest.raises(XformError, match="--name 'a/b'"):
        write_model(demo_bundle, tmp_path / "r3", ModelOptions(name="a/b"))
    r = CliRunner().invoke(main, ["triton", str(tmp_path / "nope"), "-o", str(tmp_path / "r4")])
    assert r.exit_code == 1 and "nope" in r.output
    r = CliRunner().invoke(main, ["triton", str(demo_bundle), "-o", str(tmp_path / "r5"), "--name", "digits",
                                  "--max-batch", "16"])
    assert r.exit_code == 0 and (tmp_path / "r5" / "digits" / "config.pbtxt").is_file(), r.output
    # how to serve it: xform serve here (pip's tritonserver is not on PATH), or NVIDIA's container
    assert f"xform serve {demo_bundle}" in r.output, r.output
    assert all("nvcr.io/nvidia/tritonserver" in line for line in r.output.splitlines()
               if "tritonserver --model-repository" in line), r.output
