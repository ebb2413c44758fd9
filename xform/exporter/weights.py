"""Weight-only quantization (`xform export --weights int8 / int4`): every MatMul weight as ONNX
Runtime's `com.microsoft.MatMulNBits`, blockwise symmetric int8 or int4 with one scale a block of
BLOCK_SIZE input channels; activations, LayerNorm, softmax and the K/V cache keep the bundle's
precision (fp32 or fp16). The decoder step at small batches reads every weight each step: a
quarter (int8) or an eighth (int4) of fp32's bytes, which ONNX Runtime's CUDA and CPU kernels
dequantize as they multiply. Judged, like every reduced precision, by translations
(compare.py's weight-only tolerances).

The output projection is traced as a Gemm (transB), which the quantizer does not take: it is
rewritten as MatMul + Add first, over its own transposed copy of the weight (a tied embedding
table keeps its fp32 or fp16 bytes for the Gather).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from xform.errors import XformError
from xform.manifest import WEIGHT_BITS

BLOCK_SIZE = 32  # input channels a scale covers (ONNX Runtime's quantizer defaults to 128: coarser)
# MatMulNBits' accuracy_level 4: on the CPU its activations are quantized to int8 per block and the
# product taken in int8 (MLAS), which on this 2-core EPYC took Marian-base's decoder step from 7.6 to
# 4.4 ms (int4) and from 165 to 6.5 ms (int8: level 0 dequantizes every weight each run); the CUDA
# kernels ignore it (fp16 / fp32 activations). docs/benchmarks.md "Weight-only int8 / int4"
ACCURACY_LEVEL = 4
OPERATOR = "com.microsoft.MatMulNBits"


@dataclass(frozen=True)
class WeightPlan:
    """What the manifest records of a weight-only export (manifest `weights`)."""
    name: str
    bits: int
    block_size: int = BLOCK_SIZE
    symmetric: bool = True
    accuracy_level: int = ACCURACY_LEVEL

    def to_json(self) -> dict:
        return {"name": self.name, "bits": self.bits, "block_size": self.block_size, "symmetric": self.symmetric,
                "accuracy_level": self.accuracy_level, "operator": OPERATOR}

    @property
    def plan(self) -> str:
        return (f"; MatMul weights {self.name} (weight-only: {OPERATOR}, symmetric, one scale per {self.block_size} "
                "input channels, the output projection included; activations keep the precision above, on the "
                f"CPU quantized to int8 per block for the product: accuracy_level {self.accuracy_level})")


def weight_plan(weights: str | None, precision: str) -> WeightPlan | None:
    """--weights as a plan (None: full-precision weights), refused where it has no meaning."""
    if weights is None:
        return None
    if weights not in WEIGHT_BITS:
        raise XformError(f"--weights {weights!r}: choose from {', '.join(WEIGHT_BITS)} (weight-only, {OPERATOR})")
    if precision == "int8":
        raise XformError("--weights goes with --precision fp32 or fp16 (the activations' precision); --precision "
                         "int8 already quantizes the weights, with its activations")
    needs_onnxruntime("--weights", (1, 22))  # its MatMulNBits quantizer with 8 bits (matmul_nbits_quantizer)
    return WeightPlan(weights, WEIGHT_BITS[weights])


def needs_onnxruntime(flag: str, least: tuple[int, int]) -> None:
    """Refuse `flag` before any work where the installed onnxruntime is older than `least`."""
    import onnxruntime

    found = tuple(int(p) for p in onnxruntime.__version__.split(".")[:2])
    if found < least:
        raise XformError(f"{flag} needs onnxruntime {least[0]}.{least[1]} or newer (its contrib operators and "
                         f"quantizer); found {onnxruntime.__version__}: pip install -U onnxruntime")


def gemms_as_matmuls(model: onnx.ModelProto) -> int:
    """Each Gemm over a constant 2-D weight (alpha = beta = 1, A not transposed) as MatMul + Add,
    its weight a new (K, N) initializer of its own; returns how many were rewritten."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes, rewritten, made = [], 0, set()
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        name = f"{node.input[1]}.matmul_weight{'_t' if attrs.get('transB', 0) else ''}"
        if name not in made:  # one (K, N) copy however many Gemms read the weight
            weight = numpy_helper.to_array(inits[node.input[1]])
            weight = np.ascontiguousarray(weight.T if attrs.get("transB", 0) else weight)
            model.graph.initializer.append(numpy_helper.from_array(weight, name))
            made.add(name)
        bias = node.input[2] if len(node.input) > 2 else ""
        product = f"{node.output[0]}.product" if bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name}.matmul"))
        if bias:
            nodes.append(onnx.helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten


def quantize_weights(source: Path, out: Path, plan: WeightPlan) -> int:
    """`source` (a graph in the bundle's layout) with its MatMul weights as MatMulNBits, written to
    `out` in the same layout; `source` and its data file removed. Returns how many MatMuls now
    read quantized weights."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from xform.exporter.external_data import save_with_external_data

    model = onnx.load(str(source))
    gemms_as_matmuls(model)
    before = logging.root.manager.disable
    logging.disable(max(before, logging.INFO))  # the quantizer logs each node it visits
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=plan.bits, block_size=plan.block_size,
                                         is_symmetric=plan.symmetric, accuracy_level=plan.accuracy_level)
        quantizer.process()
    finally:
        logging.disable(before)
    quantized = quantizer.model.model
    quantized.graph.ClearField("value_info")  # the quantizer's shapes for removed tensors
    left = full_weight_products(quantized)
    if left:  # the manifest says every weight is quantized: a graph where one is not is refused
        raise XformError(f"{source.name.strip('.').removesuffix('.full.onnx')}: --weights {plan.name} left "
                         f"{len(left)} product(s) over full-precision weights ({', '.join(left[:3])}), which "
                         f"MatMulNBits does not take; export without --weights")
    save_with_external_data(quantized, out)
    for p in (source, source.with_name(f"{source.name}.data")):
        p.unlink(missing_ok=True)
    return sum(n.op_type == "MatMulNBits" for n in quantized.graph.node)


def full_weight_products(model: onnx.ModelProto) -> list[str]:
    """The MatMul / Gemm nodes still reading a 2-D floating-point initializer as their weight."""
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    inits = {i.name: i for i in model.graph.initializer if i.data_type in floats and len(i.dims) == 2}
    return [n.name or n.output[0] for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits]


__all__ = ["BLOCK_SIZE", "WeightPlan", "weight_plan", "quantize_weights", "gemms_as_matmuls"]
