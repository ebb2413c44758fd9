"""Serving on NVIDIA's Triton Inference Server: a bundle as a Triton model, and `xform serve`.

- handler.py: what one Triton `execute` call does with its requests (parse, validate, decode
  the valid ones as one padded batch, split), without Triton, so it is tested on its own;
- triton_model.py: the Python-backend `model.py` that adapts handler.py to Triton's tensors;
- repository.py: `xform triton`, a model repository (config.pbtxt, model.py, the bundle);
- server.py: finding and starting `tritonserver`, waiting until it is ready, stopping it.

Above runtime: it uses the Session and never torch, models or exporter.
"""
