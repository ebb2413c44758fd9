from xform.config import *  # noqa: F401,F403  (moving to xform/config.py; removed once importers follow)
from xform.config import ACTIVATIONS, NORM_POSITIONS, POSITIONS, PRESETS, TransformerConfig, preset  # noqa: F401
