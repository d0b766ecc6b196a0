"""gpuwarden: diagnose and guard Kubernetes GPU nodes."""

import sys as _sys

__version__ = "0.1.0"


def _import_msgspec() -> None:
    """Import msgspec, whose Struct every record is, without typing_extensions.

    msgspec imports typing_extensions, when installed (grpcio installs it), only to resolve type hints
    for its encoders and decoders, which gpuwarden does not use; it falls back to `typing` without it.
    Importing it (and `inspect`, which it loads) is ~9% of the instructions of a one-shot `check`
    (docs/performance.md, issue 34). It stays importable: a later `import typing_extensions` finds it.
    """
    if "msgspec" in _sys.modules or "typing_extensions" in _sys.modules:
        return
    _sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # import of it fails: msgspec's fallback
    try:
        import msgspec  # noqa: F401
    except ImportError:  # not installed: the first record's import says so
        pass
    finally:
        del _sys.modules["typing_extensions"]


_import_msgspec()
