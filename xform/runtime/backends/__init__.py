"""Backends: the contract the decoding loop steps (backend.py) and its two implementations, ONNX
Runtime (ort_*.py, on the CPU or CUDA) and TensorRT (trt_backend.py), with what they share: the
K/V cache, device memory (cuda.py, step_inputs.py) and the GPU's description (gpu.py)."""
