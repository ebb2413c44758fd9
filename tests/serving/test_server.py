"""The real tritonserver (nvidia-pytriton's, or one on PATH) serving the demo bundle, through
tritonclient over HTTP and gRPC. Every test stops its server."""
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import xform
from tests.conftest import requires_triton
from xform.runtime.text.translator import Translator
from xform.serving.repository import ModelOptions, model_names, write_model
from xform.serving.server import ServerError, TritonServer, free_ports

pytestmark = [pytest.mark.serve, requires_triton]




def start(bundle, root, options=ModelOptions(max_batch=8, max_queue_delay_us=2000)):
    """The bundle served as `xform serve` serves it (in-flight unless options say dynamic)."""
    repo = root / "repo"
    model = write_model(bundle, repo, options, reference=True)
    return TritonServer(repo, model_names(model.name, options), "127.0.0.1", *free_ports(3),
                        bls_threads=options.bls_threads).start(prepare=lambda m: None), model.name


@pytest.fixture(scope="module")
def served(demo_bundle, tmp_path_factory):
    server, name = start(demo_bundle, tmp_path_factory.mktemp("serve"))
    yield server, name
    server.stop()


@pytest.fixture(scope="module")
def session(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def http(server):
    import tritonclient.http as th
    return th.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def grpc(server):
    import tritonclient.grpc as tg
    return tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def request(mod, texts=None, ids=None, beams=None):
    """tritonclient inputs for one request (mod: tritonclient.http or tritonclient.grpc)."""
    inputs = []
    if texts is not None:
        t = mod.InferInput("text", [len(texts), 1], "BYTES")
        t.set_data_from_numpy(np.array([[x.encode()] for x in texts], dtype=object))
        inputs.append(t)
    if ids is not None:
        t = mod.InferInput("src_ids", list(ids.shape), "INT64")
        t.set_data_from_numpy(ids)
        inputs.append(t)
    if beams is not None:
        t = mod.InferInput("num_beams", [1, 1], "INT32")
        t.set_data_from_numpy(np.array([[beams]], np.int32))
        inputs.append(t)
    return inputs


def infer(client, mod, name, **kw):
    r = client.infer(name, request(mod, **kw))
    translation = r.as_numpy("translation")
    return r.as_numpy("output_ids"), None if translation is None else [t.decode() for t in translation.reshape(-1)]


def test_http_and_grpc_answers_equal_the_session(served, session):
    import tritonclient.grpc as tg
    import tritonclient.http as th
    server, name = served
    texts = ["40512", "7", "999999"]
    src = Translator(session).policy.encode_texts(texts)
    for client, mod in ((http(server), th), (grpc(server), tg)):
        ids, translations = infer(client, mod, name, texts=texts)
        assert translations == Translator(session).translate(texts)
        np.testing.assert_array_equal(ids, session.generate(src))
        ids, translations = infer(client, mod, name, ids=src[1:2], beams=3)
        np.testing.assert_array_equal(ids, session.generate(src[1:2], num_beams=3))
        assert translations == Translator(session).translate(texts[1:2], num_beams=3)


def test_decoding_controls_over_http_and_grpc(served, session):
    """The control inputs through the real server: a target prefix, repetition controls, suppressed
    ids and scores, over HTTP and gRPC; answers equal the Session's."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    server, name = served
    for client, mod in ((http(server), th), (grpc(server), tg)):
        inputs = request(mod, texts=["40512"])
        for input_name, dtype, value in (("target_prefix", "BYTES", np.array([[b"forty one"]], dtype=object)),
                                         ("repetition_penalty", "FP32", np.array([[1.5]], np.float32)),
                                         ("no_repeat_ngram_size", "INT32", np.array([[2]], np.int32)),
                                         ("suppress_tokens", "INT32", np.array([[5, 6]], np.int32)),
                                         ("return_scores", "BOOL", np.array([[True]], bool))):
            t = mod.InferInput(input_name, list(value.shape), dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        r = client.infer(name, inputs)
        kw = dict(target_prefix=[Translator(session).policy.target_ids("forty one")], repetition_penalty=1.5, no_repeat_ngram_size=2,
                  suppress_tokens=[5, 6])
        ids, scores, tokens = session.generate(Translator(session).policy.encode_texts(["40512"]), return_token_scores=True, **kw)
        np.testing.assert_array_equal(r.as_numpy("output_ids"), ids)
        np.testing.assert_allclose(r.as_numpy("scores")[:, 0], scores, rtol=1e-6)
        np.testing.assert_allclose(r.as_numpy("token_scores"), tokens, rtol=1e-6, atol=1e-7)
        assert r.as_numpy("translation")[0, 0].decode().startswith("forty one")


def test_n_best_over_http_and_grpc(served, session):
    """num_return_sequences through the real server: each row's best and all k hypotheses."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    server, name = served
    ids, _ = session.generate(Translator(session).policy.encode_texts(["40512"]), num_beams=4, num_return_sequences=2,
                              return_scores=True)
    for client, mod in ((http(server), th), (grpc(server), tg)):
        inputs = request(mod, texts=["40512"], beams=4)
        t = mod.InferInput("num_return_sequences", [1, 1], "INT32")
        t.set_data_from_numpy(np.array([[2]], np.int32))
        inputs.append(t)
        r = client.infer(name, inputs)
        assert [h.decode() for h in r.as_numpy("hypotheses").reshape(-1)] == [session.tokenizer.decode(x)
                                                                                 for x in ids]
        np.testing.assert_array_equal(r.as_numpy("hypothesis_ids")[0, :, :ids.shape[1]], ids)
        assert r.as_numpy("translation")[0, 0].decode() == session.tokenizer.decode(ids[0])


def test_a_glossary_and_qe_over_http_and_grpc(served, session):
    """A request's glossary is enforced and answered with its confidence and unmet terms through
    the real server (the front relaying to the engine); a bad glossary is a 400 naming the input."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    server, name = served
    want = Translator(session).translate_batch(["7"], glossary={"7": "seven eleven"}, qe=True)[0]
    for client, mod in ((http(server), th), (grpc(server), tg)):
        def ask(glossary: bytes):
            inputs = request(mod, texts=["7"])
            for input_name, dtype, value in (("glossary", "BYTES", np.array([[glossary]], dtype=object)),
                                             ("qe", "BOOL", np.array([[True]], bool))):
                t = mod.InferInput(input_name, list(value.shape), dtype)
                t.set_data_from_numpy(value)
                inputs.append(t)
            return client.infer(name, inputs)
        r = ask(b"7\tseven eleven\n")
        assert r.as_numpy("translation")[0, 0].decode() == want.hypotheses[0] == "seven eleven"
        np.testing.assert_allclose(r.as_numpy("confidence")[:, 0], want.confidence, rtol=1e-6)
        assert r.as_numpy("unmet").tolist() == [[b""]]
        with pytest.raises(InferenceServerException, match=r"input 'glossary' \(TSV\), line 1"):
            ask(b"7\tseven\textra\n")


def test_8_clients_x_50_requests_with_bad_ones_mixed(served, session):
    """HTTP and gRPC clients at once; every 7th request is malformed. All good requests answered
    right and in each client's order, every bad one answered with its error, none lost; Triton
    batched requests together."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    server, name = served
    numbers = [str(n) for n in np.random.default_rng(0).integers(0, 1_000_000, 400)]
    expected = dict(zip(numbers, Translator(session).translate(numbers)))
    stats_before = http(server).get_inference_statistics(name)["model_stats"][0]

    def client(c):
        mod = th if c % 2 else tg
        cl = http(server) if c % 2 else grpc(server)
        answers = []
        for i in range(50):
            n = numbers[c * 50 + i]
            if i % 7 == 3:  # http: an id outside the vocabulary; grpc: both text and src_ids
                bad = request(mod, ids=np.array([[5, 999, 2]], np.int64)) if c % 2 else \
                    request(mod, texts=[n], ids=np.array([[5, 2]], np.int64))
                try:
                    cl.infer(name, bad)
                    answers.append(("no error",))
                except InferenceServerException as e:
                    answers.append(("error", str(e)))
            else:
                answers.append(("ok", n, infer(cl, mod, name, texts=[n])[1][0]))
        return answers

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client, range(8)))
    bad_seen = 0
    for c, answers in enumerate(results):
        assert len(answers) == 50
        for i, a in enumerate(answers):
            n = numbers[c * 50 + i]
            if i % 7 == 3:
                want = "outside the source vocabulary" if c % 2 else "exactly one of the inputs 'text' and 'src_ids'"
                assert a[0] == "error" and want in a[1], (c, i, a)
                bad_seen += 1
            else:
                assert a == ("ok", n, expected[n]), (c, i, a)
    assert bad_seen == 8 * 7
    stats = http(server).get_inference_statistics(name)["model_stats"][0]
    inferred = int(stats["inference_count"]) - int(stats_before["inference_count"])
    executions = int(stats["execution_count"]) - int(stats_before["execution_count"])
    assert inferred >= 8 * 50 - bad_seen and executions < inferred, (inferred, executions)


def test_a_killed_instance_is_reported_and_the_server_keeps_serving_others(demo_bundle, tiny_bundle, tmp_path):
    """What Triton does when a model instance's process dies: it does not restart it; every
    request that reaches it is answered with 'Stub process ... is not healthy'; the server and
    its other models keep serving."""
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    repo = tmp_path / "repo"
    write_model(tiny_bundle, repo, ModelOptions(name="ids"), reference=True)
    server, name = start(demo_bundle, tmp_path)
    server.models.append("ids")
    try:
        client = http(server)
        assert infer(client, th, name, texts=["12"])[1] == ["twelve"]
        stubs = subprocess.run(["pgrep", "-f", f"triton_python_backend_stub {repo}/{name}/"], capture_output=True,
                               text=True).stdout.split()
        assert len(stubs) == 1, stubs
        os.kill(int(stubs[0]), signal.SIGKILL)
        time.sleep(1)
        with pytest.raises(InferenceServerException, match=f"Stub process '{name}_0_0' is not healthy"):
            infer(client, th, name, texts=["12"])
        assert client.is_server_live()
        ids, _ = infer(client, th, "ids", ids=np.array([[5, 6, 2]], np.int64))
        assert ids.shape[0] == 1
    finally:
        # Triton's own exit waits its 30 s for the killed instance; the SIGKILL after 5 s ends it the same way
        assert server.stop(timeout=5) is not None


def test_a_bundle_failing_its_hashes_is_refused_at_load(demo_bundle, tmp_path):
    """Corrupted after `xform triton` copied it: the model refuses to load, the reason is in
    Triton's log, and the server does not start (it exits on a model that fails to load)."""
    from xform.errors import BundleError
    model = write_model(demo_bundle, tmp_path / "repo", ModelOptions(scheduling="dynamic"))
    with open(model / "1" / "bundle" / "decoder.onnx", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    server = TritonServer(tmp_path / "repo", ["demo"], "127.0.0.1", *free_ports(3))
    with pytest.raises(ServerError) as e:
        server.start(prepare=lambda m: None)
    msg = str(e.value)
    assert "xform: cannot load bundle" in msg and "decoder.onnx: sha256" in msg and "re-export the bundle" in msg
    with pytest.raises(BundleError, match="decoder.onnx: sha256"):  # and xform triton refuses it up front
        write_model(model / "1" / "bundle", tmp_path / "repo2")


def test_no_triton_binary_is_an_error_naming_the_install(monkeypatch, demo_bundle):
    import importlib.util

    from click.testing import CliRunner

    from xform.cli import main
    monkeypatch.setattr("shutil.which", lambda name: None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytriton" else real(name, *a))
    r = CliRunner().invoke(main, ["serve", str(demo_bundle), "--http-port", str(free_ports(1)[0])])
    assert r.exit_code == 1
    assert "no Triton Inference Server" in r.output and "pip install --no-deps nvidia-pytriton==0.7.0" in r.output


@pytest.mark.parametrize("stop, ignored_at_start", [(signal.SIGINT, False), (signal.SIGINT, True),
                                                    (signal.SIGTERM, False)], ids=["ctrl-c", "ctrl-c-after-&", "sigterm"])
def test_xform_serve_runs_until_ctrl_c(demo_bundle, stop, ignored_at_start):
    """Ctrl-C, SIGTERM, and SIGINT when a shell's `&` left it ignored, all stop the server cleanly."""
    import urllib.request
    http_port, grpc_port, metrics_port = free_ports(3)
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored_at_start else None
    proc = subprocess.Popen([str(Path(sys.executable).parent / "xform"), "serve", str(demo_bundle), "--http-port", str(http_port),
                             "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "metrics" in line:
                break
        assert any(f"http://127.0.0.1:{http_port}/v2/models/demo/infer" in x for x in lines), lines
        body = b'{"inputs":[{"name":"text","shape":[1,1],"datatype":"BYTES","data":["40512"]}]}'
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/demo/infer", body, timeout=30) as r:
            assert b"forty thousand five hundred twelve" in r.read()
        proc.send_signal(stop)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0 and "stopped tritonserver (exit code 0)" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
        still_running = subprocess.run(["pgrep", "-f", "--", f"--http-port={http_port}( |$)"], capture_output=True).returncode
        subprocess.run(["pkill", "-KILL", "-f", "--", f"--http-port={http_port}( |$)"])  # even when the test failed
    assert still_running == 1, "tritonserver outlived xform serve"


def test_the_readme_serving_lines(demo_bundle, tmp_path):
    """README "Serving": its `xform serve demo-bundle` and its curl request give the translation it shows."""
    import json
    import re
    import shlex
    import shutil
    import urllib.request

    from tests.test_readme import README, block
    step = [s.strip() for s in block("serve-command").split("&&") if s.strip().startswith("xform ")]
    assert step == ["xform serve demo-bundle"]
    curl = re.search(r"^curl .*$", README.read_text(), re.M).group(0)
    body = shlex.split(curl)[shlex.split(curl).index("-d") + 1]
    url = next(a for a in shlex.split(curl) if "/v2/models/" in a)
    shown = re.search(r'"data":\["(forty[^"]*)"\]', README.read_text()).group(1)
    shutil.copytree(demo_bundle, tmp_path / "demo-bundle")
    ports = free_ports(3)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "xform"), *shlex.split(step[0])[1:], "--http-port",
                             str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "metrics" in line:
                break
        url = "http://" + url.replace("localhost:8000", f"127.0.0.1:{ports[0]}")
        with urllib.request.urlopen(url, body.encode(), timeout=30) as r:
            answer = json.loads(r.read())
        assert {o["name"]: o["data"] for o in answer["outputs"]}["translation"] == [shown]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


@requires_triton
def test_serve_prepare_then_offline(tmp_path, monkeypatch):
    """`xform serve --prepare` makes the stub environment once (an image's build step) and exits;
    without an index, --wheel-dir must hold numpy<2 or the error says what to run; with a wheel
    directory that holds it, the environment is made offline."""
    from click.testing import CliRunner

    from xform.cli import main
    monkeypatch.setenv("XFORM_CACHE", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(main, ["serve", "--prepare", "--wheel-dir", str(empty)])
    assert r.exit_code == 1 and "--wheel-dir" in r.output and "xform serve --prepare" in r.output, r.output
    assert not list((tmp_path / "cache").glob("triton-stub-*/ready"))
    wheels = tmp_path / "wheels"
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                          "numpy>=1.26,<2", "-d", str(wheels)], capture_output=True, text=True)
    if got.returncode:
        pytest.skip(f"no package index to fetch a numpy<2 wheel from: {got.stderr[-300:]}")
    r = CliRunner().invoke(main, ["serve", "--prepare", "--wheel-dir", str(wheels)])
    assert r.exit_code == 0 and "ready to serve" in r.output and "preparing" in r.output, r.output
    assert len(list((tmp_path / "cache").glob("triton-stub-*/ready"))) == 1
    r = CliRunner().invoke(main, ["serve", "--prepare"])  # made once: nothing to install the second time
    assert r.exit_code == 0 and "preparing" not in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--prepare", "somewhere"])
    assert r.exit_code == 2 and "give no BUNDLE" in r.output


@requires_triton
def test_attention_output_of_an_aligned_bundle(tmp_path):
    """A bundle exported --with-attention: the model declares return_attention and the attention
    output, and the real server returns what generate(return_attention=True) gives."""
    import tritonclient.http as th

    from xform.exporter.export import export_bundle
    bundle = export_bundle("demo", tmp_path / "aligned", attention_layer=-1).path
    server, name = start(bundle, tmp_path)
    try:
        inputs = request(th, texts=["40512"])
        t = th.InferInput("return_attention", [1, 1], "BOOL")
        t.set_data_from_numpy(np.array([[True]], bool))
        inputs.append(t)
        r = http(server).infer(name, inputs)
        session = xform.load(bundle)
        ids, att = session.generate(Translator(session).policy.encode_texts(["40512"]), return_attention=True)
        np.testing.assert_allclose(r.as_numpy("attention"), att[:, :r.as_numpy("attention").shape[1]], atol=1e-7)
    finally:
        server.stop()
