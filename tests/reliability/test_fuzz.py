"""The push API fuzzed from its own OpenAPI description (schemathesis): no input gets a 5xx.

Runs in process against the daemon's ASGI app (nothing listens), with a
bounded number of examples per operation so it fits CI. A 503 would be the
in-flight budget, which a sequential fuzzer never reaches: any 5xx is a bug.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.serve.daemon import build_daemon

pytestmark = pytest.mark.e2e


def push_app() -> object:
    config = load({"web.api-docs": "true", "collector.gpu": "false", "collector.efa": "false",
                   "collector.netdev": "false", "collector.netstat": "false", "collector.ena": "false",
                   "collector.nccl": "false"}, environ={})
    return build_daemon(config, collectors={"steps": StepsCollector(config)}).app


schema = schemathesis.openapi.from_asgi("/openapi.json", push_app())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_push_api_never_answers_5xx(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
