"""The bundle manifest, typed: one definition that reads, validates and writes `manifest.json`.

Every reader (the runtime's Bundle, the engine builder, the CLI, serving) holds a `Manifest`, not a
dict whose keys it spells; the exporter builds one and `write` hashes the bundle's files into it.
A manifest read from disk is hostile until proved otherwise: `Manifest.from_json` checks every
field's type, the model config (`TransformerConfig.problems`, the one config validation), the graph
signatures against the ones the config implies (what the runtime allocates from) and the shared
weights' and engines' records, before anything reads them. What needs the files themselves (paths
staying inside the bundle, hashes, shared weights inside their file) is Bundle's (runtime/bundle.py).

The JSON layout (keys, nesting) is bundle format 4's, unchanged. Pure Python + json: no torch,
no onnx, no numpy.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xform.config import TransformerConfig, is_int
from xform.contract import DECODER, GRAPHS, RESTRICTED, GraphSpec, cache_dtype, signature_for
from xform.errors import BundleError, ConfigError
from xform.files import TEMP, atomic_write, sha256_file, shown

MANIFEST = "manifest.json"
FORMAT = "xform-bundle"
# 2: the decoder's K/V cache is a fixed-capacity buffer updated in place (contract.py)
# 3: the decoder reads its cross K/V once per source (`src_batch`), a source's beams as extra queries
# 4: every decoder row has its own position and end-of-sentence limit (`positions`, `min_new_tokens`
#    per row), so requests join a running batch (in-flight batching)
VERSION = 4
OLD_VERSIONS = {1: "returned a whole new K/V cache every step; this xform updates the cache in place",
                2: "read the encoder's output once per decoded row; this xform reads it once per source, "
                   "however many beams or samples decode it",
                3: "decoded every row at one position; this xform gives each row its own, so that requests join a "
                   "running batch"}
PRECISIONS = ("fp32", "fp16", "int8")
# weight-only quantization (export --weights): MatMul weights' bits, over fp32 or fp16 activations
WEIGHT_BITS = {"int8": 8, "int4": 4}
# the decoder graphs' fusions into ONNX Runtime's com.microsoft operators (export --fuse; exporter/fused.py)
FUSIONS = ("self_attention", "cross_attention", "qkv", "skip_layer_norm")
SHARED_DTYPES = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1}  # dtype -> bytes per element
MAX_DIM = 1 << 31
# generation defaults the runtime reads itself (generation.decode_cap, Session's forced first token);
# the decoding settings among them go through GenerationConfig's own validation
GENERATION_INTS = ("max_new_tokens", "max_length", "forced_bos_token_id")


class _Reader:
    """Typed fields of one JSON object, each refused with the manifest and the field named."""

    def __init__(self, where: str, data: Any, what: str):
        if not isinstance(data, dict):
            raise BundleError(f"{where}: {what} must be an object, found {_kind(data)}")
        self.where, self.data, self.what = where, data, what

    def fail(self, key: str, expected: str) -> BundleError:
        return BundleError(f"{self.where}: {self.what}.{key} must be {expected}, found {shown(self.data.get(key))}")

    def text(self, key: str, optional: bool = False) -> Any:
        v = self.data.get(key)
        if (v is None and optional) or (isinstance(v, str) and v):
            return v
        raise self.fail(key, "a non-empty string" + (" or null" if optional else ""))

    def integer(self, key: str, lo: int = 0, hi: int = MAX_DIM, optional: bool = False) -> Any:
        v = self.data.get(key)
        if (v is None and optional) or (is_int(v) and lo <= v <= hi):
            return v
        raise self.fail(key, f"an integer in [{lo}, {hi}]" + (" or null" if optional else ""))

    def mapping(self, key: str, optional: bool = False) -> Any:
        v = self.data.get(key)
        if (v is None and optional) or isinstance(v, dict):
            return v
        raise self.fail(key, "an object" + (" or null" if optional else ""))

    def sequence(self, key: str) -> list[Any]:
        v = self.data.get(key, [])
        if isinstance(v, list):
            return v
        raise self.fail(key, "a list")

    def strings(self, key: str) -> dict[str, str]:
        """An object of strings to strings."""
        v = self.data.get(key, {})
        if isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            return dict(v)
        raise self.fail(key, "an object of strings")


def _kind(v: Any) -> str:
    return "null" if v is None else type(v).__name__


@dataclass(frozen=True)
class GraphEntry:
    file: str
    signature: GraphSpec

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "signature": self.signature.to_dict()}


@dataclass(frozen=True)
class SharedWeight:
    """An initializer several graphs hold with the same bytes: a region of one bundle file the
    runtime maps once (ort_files.SharedWeight). `graphs`: graph -> initializer name."""
    file: str
    offset: int
    dtype: str
    shape: tuple[int, ...]
    graphs: dict[str, str]

    @property
    def nbytes(self) -> int:
        return SHARED_DTYPES[self.dtype] * math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "dtype": self.dtype, "shape": list(self.shape),
                "graphs": dict(self.graphs)}

    @classmethod
    def from_json(cls, data: Any, where: str, what: str, graphs: dict[str, GraphEntry]) -> "SharedWeight":
        r = _Reader(where, data, what)
        dtype = data.get("dtype")
        if dtype not in SHARED_DTYPES:
            raise BundleError(f"{where}: {what}.dtype {shown(dtype)} is not one of {list(SHARED_DTYPES)}")
        shape = data.get("shape")
        if not (isinstance(shape, list) and shape and all(is_int(d) and 1 <= d <= MAX_DIM for d in shape)):
            raise BundleError(f"{where}: {what}.shape: implausible shape {shown(shape)} (a list of sizes in "
                              "[1, 2^31])")
        names = r.strings("graphs")
        if not names or any(g not in graphs for g in names):
            raise BundleError(f"{where}: {what}.graphs {shown(names)} must map this bundle's graphs to initializer "
                              "names")
        return cls(r.text("file"), r.integer("offset", hi=1 << 62), dtype, tuple(shape), names)


@dataclass(frozen=True)
class TokenizerEntry:
    file: str
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "TokenizerEntry":
        t = _Reader(where, data, "tokenizer")
        notes = t.sequence("notes")
        if not all(isinstance(n, str) for n in notes):
            raise t.fail("notes", "a list of strings")
        return cls(t.text("file"), tuple(notes))


@dataclass(frozen=True)
class EngineEntry:
    """A TensorRT engine built from one of the bundle's graphs (exporter/engine.py), and what it
    was built from and with. `details`: the builder's own record (tensor profiles, flags, io),
    written flat beside the fields the runtime reads."""
    file: str
    graph: str
    flavor: str
    tensorrt_version: str
    onnx: str
    onnx_sha256: str
    onnx_data_sha256: str | None
    precision: str
    max_sources: int
    max_beams: int
    profile: dict[str, Any]
    target: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    FIELDS = ("file", "graph", "flavor", "tensorrt_version", "onnx", "onnx_sha256", "onnx_data_sha256", "precision",
              "max_sources", "max_beams", "profile", "target")

    def to_json(self) -> dict[str, Any]:
        return {**self.details, **{k: getattr(self, k) for k in self.FIELDS}}

    @classmethod
    def from_json(cls, data: Any, where: str, what: str) -> "EngineEntry":
        r = _Reader(where, data, what)
        profile = r.mapping("profile")
        for axis in ("batch", "src_len", "cache_len", *(["src_batch"] if "src_batch" in profile else [])):
            v = profile.get(axis)
            if not (isinstance(v, list) and len(v) == 3 and all(is_int(d) and 1 <= d <= MAX_DIM for d in v)
                    and v[0] <= v[1] <= v[2]):
                raise BundleError(f"{where}: {what}.profile.{axis} must be [min, opt, max], sizes in [1, 2^31] in "
                                  f"that order, found {shown(v)}")
        return cls(r.text("file"), r.text("graph"), r.text("flavor"), r.text("tensorrt_version"), r.text("onnx"),
                   r.text("onnx_sha256"), r.text("onnx_data_sha256", optional=True), r.text("precision"),
                   r.integer("max_sources", 1), r.integer("max_beams", 1), profile, r.mapping("target"),
                   {k: v for k, v in data.items() if k not in cls.FIELDS})


@dataclass
class Manifest:
    """What a bundle holds and how it was made. `files` (every file's sha256) is filled by `write`."""
    precision: str
    opset: int
    config: TransformerConfig
    graphs: dict[str, GraphEntry]
    reference_dir: str
    source: dict[str, Any] = field(default_factory=dict)  # where the model came from (importers' record)
    precision_plan: str = ""
    output_table: str | None = None  # --with-vocab-map: the output projection's file
    shared_weights: list[SharedWeight] = field(default_factory=list)
    attention_layer: int | None = None  # the decoder layer whose cross-attention the decoder returns
    generation: dict[str, Any] = field(default_factory=dict)  # decoding defaults; greedy when empty
    tokenizer: TokenizerEntry | None = None
    tolerance: dict[str, Any] = field(default_factory=dict)  # the export check's tolerances, for the record
    versions: dict[str, str] = field(default_factory=dict)
    engines: dict[str, EngineEntry] = field(default_factory=dict)
    verification: dict[str, Any] | None = None  # the export's figures against eager PyTorch
    files: dict[str, str] = field(default_factory=dict)
    # the (source, target) pairs the bundle translates, as its user declared them (export --languages);
    # None: what its tokenizer says (runtime/text/languages.py). Not hashed, so no format change
    languages: tuple[tuple[str, str], ...] | None = None
    # export --weights: {"name": "int4", "bits": 4, "block_size": 32, ...} (exporter/weights.py); None:
    # the precision's own weights. Older readers keep it as an unknown key, and run the graphs all the same
    weights: dict[str, Any] | None = None
    # export --fuse: the decoder graphs' fusions (FUSIONS), () for the plain graphs; read as weights is
    fusions: tuple[str, ...] = ()
    version: int = VERSION
    # keys this xform does not know (a later, compatible writer's): kept, and written back as they were
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.config_dict = self.config.to_dict()

    # -- what readers ask ----------------------------------------------------------------------
    @property
    def precision_label(self) -> str:
        """The precision as reports say it: "fp16", or "fp16 + int4 weights" (export --weights)."""
        return self.precision + (f" + {self.weights['name']} weights" if self.weights else "")

    @property
    def kv_dtype(self) -> str:
        """The K/V cache's dtype (float16 in fp16 bundles)."""
        return cache_dtype(self.graphs[DECODER].signature)

    def named_files(self) -> list[str]:
        """Every path the manifest names, for Bundle to hold inside the bundle."""
        return [*self.files, *(g.file for g in self.graphs.values()), self.reference_dir,
                *(e.file for e in self.engines.values()), *(w.file for w in self.shared_weights),
                *([self.tokenizer.file] if self.tokenizer else []),
                *([self.output_table] if self.output_table else [])]

    # -- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": self.version, "precision": self.precision, "opset": self.opset,
            "precision_plan": self.precision_plan,
            "model": {"config": self.config_dict, "source": self.source},
            "graphs": {g: e.to_json() for g, e in self.graphs.items()},
            "output_table": {"file": self.output_table} if self.output_table else None,
            "shared_weights": [w.to_json() for w in self.shared_weights],
            "attention_layer": self.attention_layer,
            "reference": {"dir": self.reference_dir},
            "generation": self.generation,
            "tokenizer": self.tokenizer.to_json() if self.tokenizer else None,
            "tolerance": self.tolerance,
            "versions": self.versions,
            "engines": {k: e.to_json() for k, e in self.engines.items()},
            **({"verification": self.verification} if self.verification is not None else {}),
            "files": self.files,
            **({"languages": [list(p) for p in self.languages]} if self.languages is not None else {}),
            **({"weights": self.weights} if self.weights is not None else {}),
            **({"fusions": list(self.fusions)} if self.fusions else {}),
            **self.extra,
        }

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        """`path` (a bundle's manifest.json), parsed and validated; BundleError naming it otherwise."""
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError(f"{path}: corrupt manifest, not valid JSON ({e})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Manifest":
        _check_version(data, where)
        r = _Reader(where, data, "manifest")
        precision = r.text("precision")
        if precision not in PRECISIONS:
            raise r.fail("precision", f"one of {list(PRECISIONS)}")
        model = _Reader(where, r.mapping("model"), "model")
        try:
            config = TransformerConfig.from_dict(model.mapping("config"), source="model.config", complete=True)
        except ConfigError as e:
            raise BundleError(f"{where}: implausible model config: {'; '.join(e.problems)}") from None
        layer = r.integer("attention_layer", 0, config.n_decoder_layers - 1, optional=True)
        graphs = _read_graphs(r, where, config, layer)
        table = r.mapping("output_table", optional=True)
        if (RESTRICTED in graphs) != bool(table):
            raise BundleError(f"{where}: the {RESTRICTED} graph and output_table go together")
        tokenizer = r.mapping("tokenizer", optional=True)
        tok = TokenizerEntry.from_json(tokenizer, where) if tokenizer is not None else None
        shared = [SharedWeight.from_json(w, where, f"shared_weights[{i}]", graphs)
                  for i, w in enumerate(r.sequence("shared_weights"))]
        engines = {k: EngineEntry.from_json(e, where, f"engines.{k}") for k, e in r.mapping("engines").items()}
        generation = _read_generation(r, where, config)
        manifest = cls(
            precision=precision, opset=r.integer("opset", 7, 99), config=config, graphs=graphs,
            reference_dir=_Reader(where, r.mapping("reference"), "reference").text("dir"),
            source=model.mapping("source"), precision_plan=r.text("precision_plan"),
            output_table=_Reader(where, table, "output_table").text("file") if table else None,
            shared_weights=shared, attention_layer=layer, generation=generation,
            tokenizer=tok, tolerance=r.mapping("tolerance"), versions=r.strings("versions"), engines=engines,
            verification=r.mapping("verification", optional=True), files=r.strings("files"),
            languages=_read_languages(r), weights=_read_weights(r, precision), fusions=_read_fusions(r))
        written = manifest.to_json()  # the keys this xform writes: the rest is kept as it came
        manifest.extra = {k: v for k, v in data.items() if k not in written}
        return manifest

    def write(self, directory: Path) -> None:
        """Hash every file under `directory` into `files` and write the manifest atomically; left
        out: the manifest, temporaries, and engine files no engine entry names (replaced ones,
        removed next)."""
        self.files = hash_files(directory, {e.file for e in self.engines.values()})
        atomic_write(directory / MANIFEST, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def hash_files(directory: Path, engines: set[str]) -> dict[str, str]:
    """The sha256 of every file under `directory` a manifest records: all but the manifest,
    temporaries, and engine files not in `engines` (the files engine entries name)."""
    paths = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST and not TEMP.match(p.name)
                   and not (p.suffix == ".engine" and p.relative_to(directory).as_posix() not in engines))
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in paths}


ENGINE_DIR = "engines"
# engine.py's file names: engines/<graph>.<flavor>.<content hash>.engine
ENGINE_FILE = re.compile(ENGINE_DIR + r"/[a-z_]+\.[a-z_]+\.[0-9a-f]{12}\.engine")


def not_ours(directory: Path) -> str | None:
    """None when `directory` holds only what xform wrote there (an empty directory, or a bundle:
    its manifest and the files it records, plus xform's temporaries and engines a killed build
    left), so that `export --force` may replace it; otherwise what stands in the way."""
    if not directory.is_dir():
        return "is a file, not a bundle directory"
    if not any(directory.iterdir()):
        return None
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        names = sorted(p.name for p in directory.iterdir())
        return (f"is not an xform bundle (no {MANIFEST}; it holds {', '.join(names[:4])}"
                f"{', ...' if len(names) > 4 else ''})")
    except (OSError, ValueError) as e:
        return f"is not an xform bundle ({MANIFEST} unreadable: {e})"
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        return f"is not an xform bundle (its {MANIFEST} is not xform's)"
    recorded = set(data["files"])
    foreign = sorted(rel for p in directory.rglob("*") if not p.is_dir() or p.is_symlink()
                     if (rel := p.relative_to(directory).as_posix()) not in recorded and rel != MANIFEST
                     and not TEMP.fullmatch(p.name) and not ENGINE_FILE.fullmatch(rel))
    if foreign:
        return (f"is a bundle holding files xform did not write ({', '.join(foreign[:4])}"
                f"{', ...' if len(foreign) > 4 else ''})")
    return None


def _check_version(data: Any, where: str) -> None:
    """An xform manifest of the version this xform reads, or a message saying what to do."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BundleError(f"{where}: not an xform manifest (expected \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if is_int(version) and version in OLD_VERSIONS:
        raise BundleError(f"{where}: manifest version {version}, exported by an earlier xform whose decoder graph "
                          f"{OLD_VERSIONS[version]} and needs version {VERSION}: re-export it "
                          "(xform export ... --force)")
    if not is_int(version) or version != VERSION:
        raise BundleError(f"{where}: manifest version {version!r} is not one this xform knows [{VERSION}]; "
                          "re-export the bundle or upgrade xform")


def _read_graphs(r: "_Reader", where: str, config: TransformerConfig, layer: int | None) -> dict[str, GraphEntry]:
    """The graphs, each signature the one the config implies."""
    graphs = {}
    for name, entry in r.mapping("graphs").items():
        g = _Reader(where, entry, f"graphs.{name}")
        try:
            spec = GraphSpec.from_dict(g.mapping("signature"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BundleError(f"{where}: malformed signature of the {name} graph ({type(e).__name__}: {e})"
                              ) from None
        graphs[name] = GraphEntry(g.text("file"), spec)
    missing = [g for g in GRAPHS if g not in graphs]
    if missing:
        raise BundleError(f"{where}: no {', '.join(missing)} graph; re-export the bundle")
    try:
        kv = cache_dtype(graphs[DECODER].signature)
    except StopIteration:
        raise BundleError(f"{where}: the decoder graph's signature has no K/V cache input") from None
    expected = signature_for(config.to_dict(), kv, attention=layer is not None)
    unknown = [g for g in graphs if g not in expected]
    if unknown:
        raise BundleError(f"{where}: unknown graphs {unknown}; known: {list(expected)}")
    for name, entry in graphs.items():
        if entry.signature != expected[name]:
            raise BundleError(f"{where}: the {name} graph's signature is not the one its config implies")
    return graphs


def language_pairs(value: Any) -> tuple[tuple[str, str], ...] | None:
    """`value` as (source, target) pairs of language codes (each a non-empty string without spaces,
    the two different; a repeated pair once), or None where it is not that."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    pairs = []
    for pair in value:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_code(c) for c in pair)) \
                or pair[0] == pair[1]:
            return None
        pairs.append((pair[0], pair[1]))
    return tuple(dict.fromkeys(pairs))


def _code(c: Any) -> bool:
    return isinstance(c, str) and bool(c) and not any(ch.isspace() or ch in ",:" for ch in c)


def _read_languages(r: "_Reader") -> tuple[tuple[str, str], ...] | None:
    """The declared language pairs, or None where the manifest declares none."""
    if r.data.get("languages") is None:
        return None
    pairs = language_pairs(r.data["languages"])
    if pairs is None:
        raise r.fail("languages", "a non-empty list of [source, target] pairs of language codes (two different "
                                  "codes without spaces)")
    return pairs


def _read_weights(r: "_Reader", precision: str) -> dict[str, Any] | None:
    """The weight-only quantization record (export --weights), or None."""
    weights = r.mapping("weights", optional=True)
    if weights is None:
        return None
    w = _Reader(r.where, weights, "weights")
    name, bits = w.text("name"), w.integer("bits", 1, 8)
    if WEIGHT_BITS.get(name) != bits or precision not in ("fp32", "fp16"):
        raise r.fail("weights", f"name and bits one of {WEIGHT_BITS} over an fp32 or fp16 bundle (this one "
                                f"{precision})")
    w.integer("block_size", 16)
    return weights


def _read_fusions(r: "_Reader") -> tuple[str, ...]:
    """The decoder graphs' fusions (export --fuse), () when there are none."""
    fusions = r.data.get("fusions", [])
    if not (isinstance(fusions, list) and all(f in FUSIONS for f in fusions) and len(set(fusions)) == len(fusions)):
        raise r.fail("fusions", f"a list of distinct fusions of {list(FUSIONS)}")
    return tuple(fusions)


def _read_generation(r: "_Reader", where: str, config: TransformerConfig) -> dict[str, Any]:
    """The decoding defaults, their token ids within the vocabulary."""
    generation = r.mapping("generation", optional=True) or {}
    for key in GENERATION_INTS:
        v = generation.get(key)
        hi = config.tgt_vocab_size - 1 if key == "forced_bos_token_id" else MAX_DIM
        if v is not None and not (is_int(v) and 0 <= v <= hi):
            raise BundleError(f"{where}: generation.{key} must be an integer in [0, {hi}] or null, found "
                              f"{shown(v)}")
    return generation
