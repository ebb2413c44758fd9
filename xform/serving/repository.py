"""`xform triton BUNDLE -o REPO`: a bundle as a model in a Triton model repository.

REPO/<name>/config.pbtxt   Python backend, the tensor contract below, dynamic batching, instances,
                           and parameters telling model.py where the bundle is and how to run it
REPO/<name>/1/model.py     xform/serving/triton_model.py
REPO/<name>/1/bundle/      a copy of the bundle (self-contained: the repository can be moved into
                           a container); with `reference=True` the config names the bundle's
                           absolute path instead (what `xform serve` does: nothing is copied)

Inputs and outputs: serving/tensors.py, the one table config.pbtxt, the handler's parsing and
docs/serving.md's tensor table come from.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from xform.errors import BundleError, XformError
from xform.files import atomic_directory, check_target
from xform.runtime.bundle import Bundle
from xform.runtime.fleet.catalog import NAME  # one rule for a model's name, a catalog's too
from xform.serving import tensors
from xform.serving.inflight import stream_model
from xform.serving.tensors import present

VOCAB_MAP = "vocab_map.txt"  # --vocab-map, in the model's version directory
GLOSSARY = "glossary"  # --glossary, in the model's version directory, with its file's suffix (.tsv, .tbx)


@dataclass(frozen=True)
class ModelOptions:
    name: str | None = None  # default: the bundle directory's name
    backend: str = "ort"  # ort | trt
    device: str | None = None  # default: cpu for ort, cuda for trt
    threads: int | None = None  # intra-op threads per instance (ort); default: all cores
    max_batch: int = 8  # Triton's max_batch_size: sources per execute call
    max_queue_delay_us: int = 1000
    dynamic_batching: bool = True
    instances: int = 1
    vocab_map: Path | None = None  # copied into the model; text requests decode over what it allows
    glossary: Path | None = None  # copied into the model; text requests without their own glossary take it
    # inflight: NAME and NAME-stream share one running batch; dynamic: Triton's batches. None:
    # inflight, or dynamic where inflight cannot run (--backend trt, --vocab-map, no dynamic batching)
    scheduling: str | None = None
    max_rows: int = 64  # the most rows (sources x beams) a request asks for; inflight: the running batch holds
    max_queue: int = 256  # inflight: requests waiting beyond the running rows; more are refused (overloaded)

    @property
    def bls_threads(self) -> int | None:
        """Triton's Python-backend threads in flight: each plain request relayed to the engine
        model holds one (and one relay thread of NAME) until its result comes; Triton's default,
        32, would cap the requests in flight at 32. None: dynamic scheduling needs no relays."""
        return self.max_queue + self.max_rows if self.mode == "inflight" else None

    @property
    def mode(self) -> str:
        """The scheduling these options run: `scheduling`, or the default for the others."""
        if self.scheduling is not None:
            return self.scheduling
        dynamic = self.backend != "ort" or self.vocab_map is not None or not self.dynamic_batching
        return "dynamic" if dynamic else "inflight"

    def problems(self) -> list[str]:
        p = []
        if self.backend not in ("ort", "trt"):
            p.append(f"--backend {self.backend!r}: Triton models run on ort or trt")
        if self.device not in (None, "cpu", "cuda"):
            p.append(f"--device {self.device!r}: cpu or cuda")
        if self.backend == "trt" and self.device == "cpu":
            p.append("--backend trt runs on cuda, not cpu")
        for flag, v, low in (("--max-batch", self.max_batch, 1), ("--instances", self.instances, 1),
                             ("--max-queue-delay-us", self.max_queue_delay_us, 0)):
            if v < low:
                p.append(f"{flag} must be >= {low}, got {v}")
        if self.threads is not None and self.threads < 1:
            p.append(f"--threads must be >= 1, got {self.threads}")
        if self.vocab_map is not None and not Path(self.vocab_map).is_file():
            p.append(f"--vocab-map {self.vocab_map}: no such file")
        if self.glossary is not None and not Path(self.glossary).is_file():
            p.append(f"--glossary {self.glossary}: no such file")
        if self.scheduling not in (None, "inflight", "dynamic"):
            p.append(f"--scheduling {self.scheduling!r}: inflight or dynamic")
        if self.mode == "inflight":
            if self.backend != "ort":
                p.append("--scheduling inflight runs on --backend ort (requests join a running batch, which the "
                         "TensorRT backend cannot yet); use --scheduling dynamic with --backend trt")
            if self.vocab_map is not None:
                p.append("--vocab-map restricts a whole batch to its sources' words: use --scheduling dynamic")
            if not self.dynamic_batching:
                p.append("--no-dynamic-batching goes with --scheduling dynamic")
        for flag, v in (("--max-rows", self.max_rows), ("--max-queue", self.max_queue)):
            if v < 1:
                p.append(f"{flag} must be >= 1, got {v}")
        if self.vocab_map is not None and self.backend != "ort":
            p.append("--vocab-map runs on --backend ort (the TensorRT engines have no restricted decoder)")
        if self.name is not None and not NAME.fullmatch(self.name):
            p.append(f"--name {self.name!r}: letters, digits, '_', '.', '-', starting with a letter or digit")
        return p


def model_name(bundle: Path, options: ModelOptions) -> str:
    name = options.name or Path(bundle).resolve().name
    if not NAME.fullmatch(name):
        raise XformError(f"model name {name!r} (from the bundle directory) is not a valid Triton model name; "
                         "pass --name")
    return name


def config_pbtxt(name: str, bundle_param: str, options: ModelOptions, has_tokenizer: bool,
                 has_attention: bool = False, role: str = "batch") -> str:
    """One model's config: role `batch` (dynamic scheduling), `engine` (NAME-stream: decoupled,
    the running batch, a `stream` input) or `front` (NAME under inflight scheduling: relays to
    the engine model, loads no bundle)."""
    device = options.device or ("cuda" if options.backend == "trt" else "cpu")
    engine = role == "engine"
    inputs = [t.pbtxt(optional=True) for t in present(tensors.inputs(), has_tokenizer, has_attention, engine)]
    outputs = [t.pbtxt(optional=False) for t in present(tensors.OUTPUTS, has_tokenizer, has_attention, engine)]
    params = {"role": role, "bundle": bundle_param, "backend": options.backend, "device": device,
              "threads": "" if options.threads is None else str(options.threads),
              "vocab_map": VOCAB_MAP if options.vocab_map is not None else "",
              "glossary": glossary_file(options.glossary) if options.glossary is not None else ""}
    params["max_rows"] = str(options.max_rows)  # the decoder rows one request may ask for (and in flight: all)
    if role == "engine":
        params.update(max_queue=str(options.max_queue))
    if role == "front":
        params = {"role": role, "engine": stream_model(name), "relays": str(options.bls_threads)}
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {options.max_batch}"]
    if role == "engine":
        lines.append("model_transaction_policy { decoupled: true }")
    if options.dynamic_batching:
        # inflight: execute only hands requests over, so the batcher need not wait to fill a batch
        delay = options.max_queue_delay_us if role == "batch" else 0
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}")
    lines += ["input [", ",\n".join(inputs), "]", "output [", ",\n".join(outputs), "]",
              f"instance_group [ {{ count: {options.instances if role != 'front' else 1} "
              f"kind: {'KIND_GPU' if device == 'cuda' else 'KIND_CPU'} }} ]"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return "\n".join(lines) + "\n"


def write_model(bundle_dir: str | Path, repo: str | Path, options: ModelOptions = ModelOptions(),
                reference: bool = False, force: bool = False) -> Path:
    """Write REPO/<name>; returns that directory. The bundle is verified first."""
    problems = options.problems()
    if problems:
        raise XformError("invalid Triton model options:\n  - " + "\n  - ".join(problems))
    bundle = Bundle.open(bundle_dir)
    if options.backend == "trt" and not bundle.manifest.engines:
        raise BundleError(f"{bundle.path}: has no TensorRT engines; run `xform build-engine {bundle.path}` "
                          "or serve it with --backend ort")
    if options.vocab_map is not None:  # checked now, against this bundle's tokenizer, not at the first request
        from xform.runtime.text.vocab_map import VocabMap
        if not bundle.has_graph("decoder_restricted") or bundle.tokenizer_file is None:
            raise XformError(f"--vocab-map: {bundle.path} needs a tokenizer and the restricted decoder: export it "
                             "with --with-vocab-map")
        from xform.runtime.text.tokenizers import load_tokenizer
        VocabMap.load(options.vocab_map, load_tokenizer(bundle.tokenizer_file, bundle.config).target_vocabulary())
    if options.glossary is not None:  # read now: a malformed one is refused naming its line, before anything is written
        from xform.runtime.text.glossary import Glossary
        if bundle.tokenizer_file is None:
            raise XformError(f"--glossary: {bundle.path} has no tokenizer, so no text requests to find terms in")
        Glossary.load(options.glossary)
    name = model_name(bundle.path, options)
    roles = model_roles(name, options)
    for model in roles:  # the bundle, the vocabulary map and the glossary are inputs: never inside what is replaced
        check_target(Path(repo) / model, force, "Triton model", not_our_model,
                     [("BUNDLE", bundle.path), *([("--vocab-map", options.vocab_map)] if options.vocab_map else []),
                      *([("--glossary", options.glossary)] if options.glossary else [])])
    has = (bundle.tokenizer_file is not None, bundle.manifest.attention_layer is not None)
    for model, role in roles.items():
        with atomic_directory(Path(repo) / model, force, not_our_model) as tmp:
            version = tmp / "1"
            version.mkdir()
            shutil.copyfile(Path(str(resources.files("xform.serving") / "triton_model.py")), version / "model.py")
            bundle_param = ""
            if role != "front":
                if reference:
                    bundle_param = str(bundle.path.resolve())
                else:
                    shutil.copytree(bundle.path, version / "bundle", symlinks=False)
                    bundle_param = "bundle"
            if options.vocab_map is not None:
                shutil.copyfile(options.vocab_map, version / VOCAB_MAP)
            if options.glossary is not None and role != "front":
                shutil.copyfile(options.glossary, version / glossary_file(options.glossary))
            (tmp / "config.pbtxt").write_text(config_pbtxt(model, bundle_param, options, *has, role=role))
    return Path(repo) / name


def glossary_file(path: Path) -> str:
    """The name of the model's copy of its --glossary: its suffix kept (TBX is read by it)."""
    return GLOSSARY + Path(path).suffix.lower()


def not_our_model(path: Path) -> str | None:
    """None when `path` is empty or a Triton model `write_model` wrote (config.pbtxt of xform's
    Python model and its version directory, nothing else), so that --force may replace it."""
    if not path.is_dir():
        return "is a file, not a Triton model directory"
    names = sorted(p.name for p in path.iterdir())
    if not names:
        return None
    config = path / "config.pbtxt"
    text = config.read_text(errors="replace") if config.is_file() else ""
    ours = set(names) <= {"config.pbtxt", "1"} and 'backend: "python"' in text and 'key: "role"' in text
    return None if ours else f"is not a Triton model xform wrote (it holds {', '.join(names[:4])})"


def model_roles(name: str, options: ModelOptions) -> dict[str, str]:
    """The models `write_model` writes for NAME, with their roles (triton_model.py)."""
    return {name: "batch"} if options.mode == "dynamic" else {name: "front", stream_model(name): "engine"}


def model_names(name: str, options: ModelOptions) -> list[str]:
    """The models `write_model` writes for NAME (what a server waits for)."""
    return list(model_roles(name, options))
