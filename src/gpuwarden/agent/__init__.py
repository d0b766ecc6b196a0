"""gpuwarden agent: runs the rules on an interval on one GPU node and reports to Kubernetes.

Modules: `config` (options, YAML + flags), `loop` (the cycle), `history` (what only time shows),
`monitors` (gRPC probes, drift, memory growth, repeated timeouts), `conditions` (NodeConditions),
`events` (core/v1 Events), `metrics` (Prometheus), `server` (/metrics, /healthz, /readyz) and
`kube` (a thin REST wrapper over the kubernetes client, imported only here).

Nothing heavy is imported by this package: `gpuwarden check` never loads the kubernetes client.
See docs/agent.md.
"""
