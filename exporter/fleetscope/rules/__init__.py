"""Prometheus rules for fleetscope metrics, generated from one source of truth.

:mod:`~fleetscope.rules.settings` holds every threshold, window and the
target selector; the ``training``, ``gpu``, ``network`` and ``selfmon``
modules build the recording and alerting rules from those settings, and
:mod:`~fleetscope.rules.render` writes them as a Prometheus rule file or a
Kubernetes ``PrometheusRule``. ``alerts/`` holds the rendered files.
"""

from __future__ import annotations

from fleetscope.rules.settings import E2E, PRESETS, PRODUCTION, Settings

__all__ = ["E2E", "PRESETS", "PRODUCTION", "Settings"]
