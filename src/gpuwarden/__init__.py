"""gpuwarden: diagnose and guard Kubernetes GPU nodes."""

__version__ = "0.1.0"
