"""Triton Python-backend model for an xform bundle (copied as `<model>/1/model.py` by `xform triton`).

The bundle and how to run it come from config.pbtxt's parameters: `bundle` (a path, relative to
this version directory or absolute), `backend` (ort | trt), `device` (cpu | cuda), `threads`.
Loading verifies the bundle (hashes, manifest version); a bundle that fails is refused and the
reason goes to Triton's log. Requests are handled by xform.serving.handler.
"""
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from xform.serving.handler import INPUTS, execute


class TritonPythonModel:
    def initialize(self, args):
        from xform.errors import XformError
        from xform.runtime.open import open_session

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        bundle = Path(params["bundle"])
        if not bundle.is_absolute():
            bundle = Path(args["model_repository"]) / args["model_version"] / bundle
        threads = int(params["threads"]) if params.get("threads") else None
        try:
            self.session = open_session(bundle, params["backend"], params["device"], threads)
        except XformError as e:  # the reason, without a traceback, in Triton's log and load status
            raise pb_utils.TritonModelException(f"xform: cannot load bundle {bundle}: {e}") from None
        self.vocab_map = None
        if params.get("vocab_map"):  # checked when the model was written; a failure here is the reason in the log
            try:
                self.vocab_map = self.session.vocab_map(Path(args["model_repository"]) / args["model_version"]
                                                        / params["vocab_map"])
            except XformError as e:
                raise pb_utils.TritonModelException(f"xform: vocabulary map: {e}") from None
        pb_utils.Logger.log_info(f"xform: serving {bundle} on {params['backend']} ({params['device']})")

    def execute(self, requests):
        inputs = []
        for request in requests:
            tensors = {}
            for name in INPUTS:
                t = pb_utils.get_input_tensor_by_name(request, name)
                tensors[name] = None if t is None else t.as_numpy()
            inputs.append(tensors)
        responses = []
        for result in execute(self.session, inputs, self.vocab_map):
            if isinstance(result, str):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(result)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in result.items()]))
        return responses
