"""The memory analysis of incident 4, pure functions of parsed text (no I/O), one module a question:

- `ledger`: where every byte of MemTotal is, and what no counter and no memory cgroup holds;
- `attribution`: who may hold that memory (the NVIDIA device holders) and what separates them;
- `trend`: what the agent's samples show across checks (rate, time to exhaustion, arrivals, exits);
- `escape`: whether a pod has escaped its memory limit through the driver, and by how much.

`facts/memory.py` collects the inputs and `rules/memory.py` turns the result into GPU-NODE-001.
"""
