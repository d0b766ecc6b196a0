"""Strict validation of Kubernetes objects against the kubernetes Python client's models.

`ApiClient().deserialize` (and the models' `from_dict`) silently drop unknown keys, so a typo such
as `volumeMount` would pass. `validate(obj)` walks the dict against each model's `attribute_map`
(wire names) and `openapi_types` recursively: unknown fields, wrong scalar types and missing
required fields (the pydantic model's own check, via `from_dict`) all raise SchemaError with the
path of the offending field.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")

#: apiVersion group -> model-class prefix infix (V1 + kind, or e.g. V1 for rbac/v1)
_SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "bytearray": (str,),
            "date": (str, dt.date), "datetime": (str, dt.datetime)}


class SchemaError(ValueError):
    pass


def model_for(obj: dict) -> type:
    from kubernetes import client

    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    version = api_version.rsplit("/", 1)[-1]
    name = version[:1].upper() + version[1:] + kind
    model = getattr(client, name, None)
    if model is None:
        raise SchemaError(f"no model {name} for {api_version} {kind}")
    return model


def _model(name: str) -> type:
    from kubernetes import client

    m = getattr(client, name, None)
    if m is None:
        raise SchemaError(f"unknown model type {name}")
    return m


def _check(value: Any, typ: str, path: str) -> None:
    if value is None:
        return
    m = _LIST.match(typ)
    if m:
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list ({typ}), got {type(value).__name__}")
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{path}[{i}]")
        return
    m = _DICT.match(typ)
    if m:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a mapping ({typ}), got {type(value).__name__}")
        for k, item in value.items():
            _check(item, m.group(1), f"{path}.{k}")
        return
    if typ == "object":  # IntOrString, RawExtension, free-form
        return
    if typ in _SCALARS:
        ok = _SCALARS[typ]
        if isinstance(value, bool) and typ != "bool":
            raise SchemaError(f"{path}: expected {typ}, got bool")
        if not isinstance(value, ok):
            raise SchemaError(f"{path}: expected {typ}, got {type(value).__name__} {value!r}")
        return
    _walk(value, _model(typ), path)


def _walk(obj: Any, model: type, path: str) -> None:
    if not isinstance(obj, dict):
        raise SchemaError(f"{path}: expected an object ({model.__name__}), got {type(obj).__name__}")
    wire_to_attr = {wire: attr for attr, wire in model.attribute_map.items()}
    for key, value in obj.items():
        attr = wire_to_attr.get(key)
        if attr is None:
            raise SchemaError(f"{path}.{key}: unknown field of {model.__name__}")
        _check(value, model.openapi_types[attr], f"{path}.{key}")


def validate(obj: dict) -> Any:
    """Raise SchemaError unless `obj` is a valid object of its apiVersion/kind; return the model."""
    model = model_for(obj)
    _walk(obj, model, obj.get("kind", "object"))
    try:
        return model.from_dict(obj)
    except Exception as exc:  # pydantic: required fields, enums, nested types
        raise SchemaError(f"{obj.get('kind')}: {exc}") from None
