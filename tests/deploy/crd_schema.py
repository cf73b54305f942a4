"""Custom resources checked as the API server checks them: against their CRD's OpenAPI v3
schema (vendored in crds/, README.md there says from where), made strict the way
``kubectl apply --validate=strict`` is for built-in kinds: an unknown field is an error, not
silently pruned. CEL rules (x-kubernetes-validations) are not evaluated here."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parent / "crds"


class KubeLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it: PyYAML's YAML 1.1 takes a bare ``=`` (kustomize writes
    the AlertmanagerConfig's ``matchType: =`` so) for a "value" tag it cannot construct."""


KubeLoader.add_constructor("tag:yaml.org,2002:value", yaml.constructor.SafeConstructor.construct_yaml_str)


def strict(schema: object) -> object:
    """The schema with unknown fields forbidden wherever the CRD does not preserve them, and
    Kubernetes' int-or-string spelled in JSON Schema."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) if key not in ("enum", "default", "example") else value
           for key, value in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@cache
def custom_resource_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    group, version = api_version.split("/")
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            for v in crd["spec"]["versions"]:
                if v["name"] == version and v.get("served", True):
                    schema = strict(v["schema"]["openAPIV3Schema"])
                    schema["properties"]["metadata"] = {"type": "object"}  # checked by the API server's own rules
                    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
                    return jsonschema.Draft4Validator(schema)
            raise KeyError(f"{path.name} does not serve {version}")
    raise KeyError(f"no vendored CRD for {kind} in {group} ({CRD_DIR})")
