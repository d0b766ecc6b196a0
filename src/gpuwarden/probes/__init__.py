"""Live probes: everything that touches the running system, each bounded by a hard deadline."""
