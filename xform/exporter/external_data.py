"""The graphs' weights in one external data file beside each graph, every tensor at a page
boundary (ALIGN) so that ONNX Runtime maps them in place instead of copying."""
from __future__ import annotations

from pathlib import Path

import onnx

ALIGN = 4096  # each tensor's offset in the data file: a page, so ONNX Runtime can map it in place


def all_tensors(proto: "onnx.ModelProto"):
    """The graph's initializers and the tensors its nodes hold as attributes (Constant values)."""
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def gather_external_data(proto: "onnx.ModelProto", source: Path, path: Path) -> None:
    """Move the exporter's external initializers (files in `source`) into one `<name>.onnx.data`
    beside `path`, streamed, each at a page-aligned offset; inline initializers above 1 KiB move
    there too, and Constant values it wrote out come back inline."""
    location = f"{path.name}.data"
    with open(path.parent / location, "wb") as out:

        def place(tensor, data: bytes | None = None) -> None:
            offset = -(-out.tell() // ALIGN) * ALIGN
            out.seek(offset)
            if data is not None:
                out.write(data)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
            else:
                info = {e.key: e.value for e in tensor.external_data}
                with open(source / info["location"], "rb") as f:
                    f.seek(int(info.get("offset", 0)))
                    remaining = int(info["length"]) if "length" in info else None
                    while remaining is None or remaining:
                        chunk = f.read(1 << 24 if remaining is None else min(remaining, 1 << 24))
                        if not chunk:
                            if remaining:
                                raise OSError(f"{source / info['location']}: ends before tensor {tensor.name}")
                            break
                        out.write(chunk)
                        if remaining is not None:
                            remaining -= len(chunk)
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(out.tell() - offset))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value

        for tensor in proto.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                place(tensor)
            elif len(tensor.raw_data) > 1024:
                place(tensor, tensor.raw_data)
        for node in proto.graph.node:  # Constant values the exporter wrote out go back inline: ONNX
            for attr in node.attribute:  # Runtime's shape inference reads them, and cannot read external data
                for tensor in ([attr.t] if attr.HasField("t") else []) + list(attr.tensors):
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        info = {e.key: e.value for e in tensor.external_data}
                        with open(source / info["location"], "rb") as f:
                            f.seek(int(info.get("offset", 0)))
                            tensor.raw_data = f.read(int(info["length"])) if "length" in info else f.read()
                        del tensor.external_data[:]
                        tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save_model(proto, str(path))


def save_with_external_data(model: "onnx.ModelProto", path: Path) -> None:
    """Weights in `<name>.onnx.data` beside the graph: ONNX Runtime memory-maps external data,
    so pages a session never touches (most of an embedding table) never become resident
    (measured on Marian-base: peak RSS 439 -> 355 MiB), and graphs of any size fit. `model` holds
    all its data: an existing data file is replaced (onnx would append to it, keeping dead bytes:
    1.3 GB of them in an NLLB-sized int8 encoder)."""
    (path.parent / f"{path.name}.data").unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
