"""The bundle: a deployment directory and its versioned manifest (DESIGN section 2).

Reads and validates manifests, verifies file hashes, and writes manifests (through xform.files,
the crash-safe writes every layer uses). The exporter and the engine builder write through
`write_manifest`; the runtime reads through `Bundle.open`. Pure Python + json: no torch, no onnx.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from xform.contract import GRAPHS, RESTRICTED, GraphSpec, signature_for
from xform.errors import BundleError
from xform.files import TEMP, atomic_write, drop_cached, sha256_file

MANIFEST = "manifest.json"
FORMAT = "xform-bundle"
# 2: the decoder's K/V cache is a fixed-capacity buffer updated in place (contract.py)
# 3: the decoder reads its cross K/V once per source (`src_batch`), a source's beams as extra queries
# 4: every decoder row has its own position and end-of-sentence limit (`positions`, `min_new_tokens`
#    per row), so requests join a running batch (in-flight batching)
VERSION = 4
KNOWN_VERSIONS = (4,)
OLD_VERSIONS = {1: "returned a whole new K/V cache every step; this xform updates the cache in place",
                2: "read the encoder's output once per decoded row; this xform reads it once per source, "
                   "however many beams or samples decode it",
                3: "decoded every row at one position; this xform gives each row its own, so that requests join a "
                   "running batch"}
SHARED_DTYPES = ("float32", "float16", "int8", "uint8")


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Bundle":
        path = Path(path)
        mpath = path / MANIFEST
        if not path.is_dir():
            raise BundleError(f"{path}: not a directory; a bundle is a directory made by `xform export`")
        if not mpath.is_file():
            raise BundleError(f"{mpath}: missing; {path} is not an xform bundle (run `xform export` to make one)")
        try:
            manifest = json.loads(mpath.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError(f"{mpath}: corrupt manifest, not valid JSON ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise BundleError(f"{mpath}: not an xform manifest (expected \"format\": \"{FORMAT}\")")
        old = manifest.get("version")
        if isinstance(old, int) and old in OLD_VERSIONS:
            raise BundleError(f"{mpath}: manifest version {old}, exported by an earlier xform whose decoder graph "
                              f"{OLD_VERSIONS[old]} and needs version {VERSION}: re-export it "
                              "(xform export ... --force)")
        if manifest.get("version") not in KNOWN_VERSIONS:
            raise BundleError(f"{mpath}: manifest version {manifest.get('version')!r} is not one this xform "
                              f"knows {list(KNOWN_VERSIONS)}; re-export the bundle or upgrade xform")
        bundle = cls(path, manifest)
        bundle.validate()
        if verify:
            bundle.verify_files()
        return bundle

    def validate(self) -> None:
        """Treat the manifest as hostile: every path it names stays inside the bundle (relative, no
        `..`, no symlink out), the config's sizes are plausible, and the graph signatures are the
        ones the config implies (what the runtime allocates from)."""
        mpath = self.path / MANIFEST
        m = self.manifest
        try:
            named = [*m.get("files", {}), *(g["file"] for g in m["graphs"].values()), m["reference"]["dir"],
                     *(e["file"] for e in m.get("engines", {}).values())]
            if m.get("tokenizer"):
                named.append(m["tokenizer"]["file"])
        except (KeyError, TypeError, AttributeError) as e:
            raise BundleError(f"{mpath}: malformed manifest ({type(e).__name__}: {e})") from None
        for name in named:
            self.inside(name)
        problems = config_problems(self.config)
        if problems:
            raise BundleError(f"{mpath}: implausible model config: " + "; ".join(problems))
        decoder_inputs = m["graphs"].get("decoder", {}).get("signature", {}).get("inputs", [])
        kv_dtype = next((t.get("dtype") for t in decoder_inputs
                         if isinstance(t, dict) and t.get("name") == "cache_key_0"),
                        "float32")
        layer = m.get("attention_layer")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)
                                  or not 0 <= layer < self.config["n_decoder_layers"]):
            raise BundleError(f"{mpath}: attention_layer must be a decoder layer (0 to "
                              f"{self.config['n_decoder_layers'] - 1}) or null, got {layer!r}")
        expected = signature_for(self.config, kv_dtype, attention=layer is not None)
        missing = [g for g in GRAPHS if g not in m["graphs"]]
        if missing:
            raise BundleError(f"{mpath}: no {', '.join(missing)} graph; re-export the bundle")
        unknown = [g for g in m["graphs"] if g not in expected]
        if unknown:
            raise BundleError(f"{mpath}: unknown graphs {unknown}; known: {list(expected)}")
        table = m.get("output_table")
        if (RESTRICTED in m["graphs"]) != bool(table):
            raise BundleError(f"{mpath}: the {RESTRICTED} graph and output_table go together")
        if table:
            try:
                self.inside(table["file"])
            except (KeyError, TypeError) as e:
                raise BundleError(f"{mpath}: malformed output_table ({type(e).__name__}: {e})") from None
        self.shared_weights()
        for graph, entry in m["graphs"].items():
            if graph in expected and entry.get("signature") != expected[graph].to_dict():
                raise BundleError(f"{mpath}: the {graph} graph's signature is not the one its config implies")

    def shared_weights(self) -> list[dict[str, Any]]:
        """The manifest's `shared_weights`: initializers several graphs hold with the same bytes, as
        a region of one bundle file that the runtime maps once ({file, offset, dtype, shape, nbytes,
        graphs: {graph: initializer name}}). Each is checked to lie inside its file."""
        mpath = self.path / MANIFEST
        entries = self.manifest.get("shared_weights", [])
        if not isinstance(entries, list):
            raise BundleError(f"{mpath}: shared_weights must be a list, got {type(entries).__name__}")
        out = []
        for i, w in enumerate(entries):
            where = f"{mpath}: shared_weights[{i}]"
            try:
                path = self.inside(w["file"])
                dtype = np.dtype(w["dtype"]) if w["dtype"] in SHARED_DTYPES else None
                shape = [int(d) for d in w["shape"]]
                offset = int(w["offset"])
                graphs = dict(w["graphs"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise BundleError(f"{where}: malformed ({type(e).__name__}: {e})") from None
            if dtype is None:
                raise BundleError(f"{where}: dtype {w['dtype']!r} is not one of {list(SHARED_DTYPES)}")
            if not shape or any(d < 1 or d > 2**31 for d in shape) or offset < 0:
                raise BundleError(f"{where}: implausible shape {shape} or offset {offset}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            end = offset + nbytes
            size = path.stat().st_size if path.is_file() else None
            if size is None or end > size:
                raise BundleError(f"{where}: bytes {offset}..{end} lie outside {path} "
                                  f"({'missing' if size is None else f'{size} bytes'})")
            if not graphs or any(g not in self.manifest["graphs"] or not isinstance(n, str) for g, n in graphs.items()):
                raise BundleError(f"{where}: graphs {graphs!r} must map this bundle's graphs to initializer names")
            out.append({"file": w["file"], "offset": offset, "dtype": dtype.name, "shape": shape, "nbytes": nbytes,
                        "graphs": graphs})
        return out

    def inside(self, name: Any) -> Path:
        """`name` as a path inside the bundle; refused when it could lead outside it."""
        mpath = self.path / MANIFEST
        if not isinstance(name, str) or not name or "\x00" in name:
            raise BundleError(f"{mpath}: names an invalid path {name!r}")
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or "\\" in name:
            raise BundleError(f"{mpath}: names the path {name!r}, which leads outside the bundle; "
                              "a bundle names its files relative to itself")
        p = self.path / pure
        root = self.path.resolve()
        if p.is_symlink() or not p.resolve().is_relative_to(root):
            raise BundleError(f"{p}: a symlink (to {os.path.realpath(p)}); a bundle's files are its own, "
                              "not links to elsewhere")
        return p

    def verify_files(self, names: list[str] | None = None) -> None:
        """Every file against its sha256. Hashing reads the shared weights too: their bytes are
        dropped from the page cache afterwards, so that this process (or another xform on the same
        bundle) does not leave them cached for a running session's lookups to map wholesale
        (ort_backend.SharedWeight.page_out)."""
        files: dict[str, str] = self.manifest.get("files", {})
        for name in names if names is not None else list(files):
            if name not in files:
                raise BundleError(f"{self.path / MANIFEST}: no hash recorded for {name}")
            p = self.path / name
            if not p.is_file():
                raise BundleError(f"{p}: missing (the manifest lists it)")
            got = sha256_file(p)
            if got != files[name]:
                raise BundleError(f"{p}: sha256 {got[:16]}... does not match the manifest's {files[name][:16]}...; "
                                  "the file was changed or corrupted after export; re-export the bundle")
        for w in self.shared_weights():
            if names is None or w["file"] in names:
                drop_cached(self.path / w["file"], w["offset"], w["nbytes"])

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["model"]["config"]

    @property
    def precision(self) -> str:
        return self.manifest["precision"]

    def has_graph(self, graph: str) -> bool:
        return graph in self.manifest["graphs"]

    def graph_spec(self, graph: str) -> GraphSpec:
        return GraphSpec.from_dict(self.manifest["graphs"][graph]["signature"])

    def file(self, key: str) -> Path:
        return self.path / key

    def graph_file(self, graph: str) -> Path:
        return self.path / self.manifest["graphs"][graph]["file"]

    @property
    def tokenizer_file(self) -> Path | None:
        tok = self.manifest.get("tokenizer")
        return None if not tok else self.path / tok["file"]


# Upper bounds no real model reaches: a manifest beyond them is refused before anything is allocated.
LIMITS = {"src_vocab_size": 1 << 22, "tgt_vocab_size": 1 << 22, "d_model": 1 << 16, "n_heads": 1 << 10,
          "d_ff": 1 << 18, "n_encoder_layers": 1 << 10, "n_decoder_layers": 1 << 10, "max_len": 1 << 20}


def config_problems(config: Any) -> list[str]:
    if not isinstance(config, dict):
        return [f"config is {type(config).__name__}, not an object"]
    problems = []
    for key, limit in LIMITS.items():
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
            problems.append(f"{key} is {v!r}, expected an integer in [1, {limit}]")
    head = config.get("attention_head_dim")
    if head is not None and (isinstance(head, bool) or not isinstance(head, int) or not 1 <= head <= 1 << 12):
        problems.append(f"attention_head_dim is {head!r}, expected an integer in [1, 4096] or null")
    for key in ("pad_id", "bos_id", "eos_id"):
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (config.get("tgt_vocab_size") or 0):
            problems.append(f"{key} is {v!r}, expected an id below tgt_vocab_size")
    return problems


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Hash every file under `directory` into manifest["files"] and write it; left out: the manifest,
    temporaries, and engine files the manifest's engines do not name (replaced ones, removed next)."""
    engines = {e["file"] for e in manifest.get("engines", {}).values()}
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST and not TEMP.match(p.name)
                   and not (p.suffix == ".engine" and p.relative_to(directory).as_posix() not in engines))
    manifest["files"] = {p.relative_to(directory).as_posix(): sha256_file(p) for p in files}
    atomic_write(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
