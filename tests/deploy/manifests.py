"""Helpers for the deployment tests: render kustomize trees and validate objects offline."""

from __future__ import annotations

import copy
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.conftest import ROOT, require_binary

REPO = Path(ROOT)
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUSTOMIZE_DIR / "overlays").iterdir() if (p / "kustomization.yaml").exists())
# Oldest Kubernetes minor the manifests are checked against (EKS standard support).
KUBERNETES_VERSION = "1.32"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleetscope_deploy_generate", KUSTOMIZE_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = require_binary("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=180,
                            check=False)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# -- offline schema validation --------------------------------------------------------------------


def _forbid_unknown_fields(schema: Any) -> Any:
    """Close every object schema that lists its properties, as kubectl's strict field validation does."""
    if isinstance(schema, dict):
        closed = {key: _forbid_unknown_fields(value) for key, value in schema.items()}
        if "properties" in closed and "additionalProperties" not in closed:
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_forbid_unknown_fields(item) for item in schema]
    return schema


@functools.cache
def monitoring_crd_schema(kind: str) -> dict[str, Any]:
    """JSON schema of a prometheus-operator CRD, from the models generated from its CRDs.

    cloudcoil-models-prometheus-operator is generated from the operator's CRD
    OpenAPI schemas (field names, enums, patterns); pydantic turns it back
    into a JSON schema, closed here against unknown fields.
    """
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, kind)
    return _forbid_unknown_fields(model.model_json_schema(by_alias=True, mode="validation"))


def validate(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` does not match its Kubernetes or monitoring-CRD schema."""
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        import jsonschema

        jsonschema.Draft202012Validator(monitoring_crd_schema(obj["kind"])).validate(copy.deepcopy(obj))
        return
    import kubernetes_validate.utils

    # The library reads and parses its schema files at every call (1.3 MB of definitions, 32 ms a call against
    # 4.5 ms once read): here each file is read once a test process; the validation is still all the library's.
    if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
        kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
