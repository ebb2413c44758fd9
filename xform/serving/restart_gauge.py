"""The restarts of tritonserver by `xform serve` (serving/lifecycle.py's Restarts) in Triton's
/metrics: `xform_serve_restarts{instance="MODEL_G_I"}`, a gauge each model instance sets at its start
from XFORM_SERVE_RESTARTS, which serve gives each server it starts (0 at first, 1 after the first
restart...). Runs inside a Triton Python-backend stub; a Triton without custom metrics logs a
warning and serves on."""
from __future__ import annotations

import os

RESTARTS_ENV = "XFORM_SERVE_RESTARTS"


def restarts() -> int:
    """The restarts this server was started after (0 where serve did not say, or said nonsense)."""
    value = os.environ.get(RESTARTS_ENV, "0")
    return int(value) if value.isdigit() else 0


def publish(pb_utils, instance: str):
    """Set the gauge for this model instance; the metric, which must be kept alive (Triton drops a
    metric whose object is collected), or None where this Triton has no custom metrics."""
    try:
        family = pb_utils.MetricFamily("xform_serve_restarts", "Times xform serve restarted this tritonserver "
                                       "after a crash", pb_utils.MetricFamily.GAUGE)
        metric = family.Metric(labels={"instance": instance})
        metric.set(restarts())
        return family, metric
    except Exception as e:  # noqa: BLE001 - a metric is a help, never a reason not to serve
        pb_utils.Logger.log_warn(f"xform: no restart metric: {e}")
        return None
