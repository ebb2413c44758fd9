"""xform: deploy encoder-decoder Transformers fast and faithfully.

Importing xform imports neither torch nor onnxruntime; they load when a function needs them.
"""
from __future__ import annotations

# The minor number is the bundle format (runtime/bundle.py VERSION) while the major is 0: a
# release that changes what a bundle holds moves it, and `xform --version` names both.
__version__ = "0.4.0"

from xform.errors import XformError  # noqa: E402

__all__ = ["__version__", "XformError", "load", "check", "export", "Translator", "FleetTranslator"]


def __getattr__(name):
    if name in ("load", "check", "Translator", "FleetTranslator"):
        from xform import api
        return getattr(api, name)
    if name == "export":
        from xform.exporter.export import export_bundle
        return export_bundle
    raise AttributeError(f"module 'xform' has no attribute {name!r}")
