"""Reading and exactly evaluating cgroup v2 device-access BPF programs."""
