"""Strict validation of Kubernetes objects against the Kubernetes OpenAPI schemas, offline.

The schemas are the JSON schemas generated from Kubernetes' OpenAPI documents, one set per
release, shipped by the `kubernetes-validate` package (a test extra). Strict mode rejects unknown
fields, so a typo such as `volumeMount` fails, as do wrong types and missing required fields.
Objects are checked against the oldest and the newest release we support.
"""

from __future__ import annotations

VERSIONS = ("1.29.0", "1.37.0")  # the oldest Kubernetes release supported, and the newest (README, docs/install.md)
#: kinds that need a newer cluster than VERSIONS[0]: the chart renders them only there (its node-confinement
#: policy follows .Capabilities.KubeVersion); the plain manifests, rendered for a recent release, carry them
SINCE = {("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "1.30.0",
         ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): "1.30.0"}


class SchemaError(ValueError):
    pass


def validate(obj: dict, versions: tuple[str, ...] = VERSIONS, exact: bool = False) -> None:
    """Raise SchemaError (with the offending field's path) unless `obj` is valid in every version.

    `exact`: in exactly these versions (an object rendered for that cluster), not from its SINCE on.
    """
    import kubernetes_validate as kv

    since = SINCE.get((obj.get("apiVersion"), obj.get("kind")))
    if since and not exact:
        versions = tuple(dict.fromkeys(max(v, since, key=lambda x: tuple(map(int, x.split(".")))) for v in versions))
    for version in versions:
        try:
            kv.validate(obj, version, strict=True)
        except kv.SchemaNotFoundError as e:
            raise SchemaError(f"Kubernetes {version} has no schema for {obj.get('apiVersion')} {obj.get('kind')}: "
                              f"{e}") from None
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise SchemaError(f"Kubernetes {version}: {path or '(object)'}: {e.message}") from None
