"""YAML from anyone (a config file, a kubeconfig, a node's kubelet config or CDI spec), loaded safely.

PyYAML's safe loader builds no objects, but it is not bounded: nine levels of ten aliases expand to
10^9 nodes for whoever walks the result (1.48 GB for one agent config), a scanner is quadratic in
flow nesting, and a bad scalar raises what YAMLError does not cover (`2020-13-45` and `!!int abc`
a ValueError, `!!bool maybe` a KeyError, `!!timestamp x` an AttributeError, a 5,000-digit integer
a ValueError). `load` composes the node graph first, refuses it when it is recursive or its
expanded size (aliases counted as often as they are used) passes `max_nodes`, and turns every
failure into one `YamlError` line.
"""

from __future__ import annotations

from typing import Any

#: an option file or a kubeconfig holds hundreds of nodes, a node's CDI spec a few thousand
MAX_NODES = 100_000
#: no config nests deeper than this; PyYAML's scanner is quadratic in flow depth (5,000 "[" take 4 s)
MAX_DEPTH = 64


class YamlError(ValueError):
    """Not YAML, or YAML no config is: one line, the reason."""


def flow_depth(raw: bytes | str) -> int:
    """The deepest [ / { nesting in raw (quotes ignored: an over-estimate only refuses sooner)."""
    data = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
    depth = deepest = 0
    for b in data.replace(b"\x00", b""):
        if b in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D) and depth:
            depth -= 1
    return deepest


def _expanded_size(root: Any, limit: int) -> int:
    """Nodes of the document with every alias expanded (a DAG counted by memo), up to limit + 1.

    YamlError when an alias refers to a node that contains it (a recursive document)."""
    import yaml

    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node, yaml)
            size[key] = min(limit + 1, 1 + sum(size[id(c)] for c in children))
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlError("an alias refers to a node that contains it (a recursive document)")
        on_path.add(key)
        stack.append((node, True))
        for c in _children(node, yaml):
            if id(c) in on_path:
                raise YamlError("an alias refers to a node that contains it (a recursive document)")
            if id(c) not in size:
                stack.append((c, False))
    return size[id(root)]


def _children(node: Any, yaml: Any) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(raw: bytes | str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document of raw (bytes: YAML's own encoding detection), or YamlError."""
    import yaml

    if flow_depth(raw) > max_depth:
        raise YamlError(f"nested deeper than {max_depth} levels")
    loader = _loader()(raw)
    docs = []
    total = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            total += _expanded_size(node, max_nodes)
            if total > max_nodes:
                raise YamlError(f"more than {max_nodes:,} nodes once its aliases are expanded")
            docs.append(loader.construct_document(node))
    except YamlError:
        raise
    except yaml.YAMLError as exc:
        raise YamlError(" ".join(str(exc).split())[:200]) from None
    except RecursionError:
        raise YamlError("nested too deeply") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError, UnicodeError) as exc:
        # a scalar its tag cannot build: !!int abc, 2020-13-45, !!bool maybe, !!timestamp x, 5,000 digits
        raise YamlError(f"a value YAML cannot read ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") \
            from None
    finally:
        loader.dispose()
    return docs


def load(raw: bytes | str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """The single document of raw (None when empty), or YamlError."""
    docs = load_all(raw, max_nodes, max_depth)
    if len(docs) > 1:
        raise YamlError("more than one document")
    return docs[0] if docs else None
