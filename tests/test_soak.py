"""Soak (short form; scripts/soak.py runs it for hours): 10,000 decoder steps in varied batch
shapes and strategies on one session, with text through translate, and resident memory stays
flat after the warm-up: growth under 5 MiB."""
import pytest

import xform
from xform.runtime.soak import soak

pytestmark = pytest.mark.soak
BOUND_MIB = 5.0


def test_resident_memory_is_flat_over_10000_steps(demo_bundle):
    session = xform.load(demo_bundle, backend="ort")
    report = soak(session, 10_000, texts=[str(n) for n in range(100_000, 100_500)], seed=1)
    assert report.steps >= 10_000 and report.calls > 500
    assert report.growth_mib < BOUND_MIB, (report.warm_rss_mib, report.samples)
