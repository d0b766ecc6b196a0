"""Guarded remediation: a plan computed from findings and cluster state, then executed (or printed).

`plan` (what to do, pure), `guard` (who must never be touched, token buckets, cooldowns),
`breaker` (the cluster-wide stop switch), `actions` (one API call per action kind),
`executor` (breaker -> cooldown -> rate limit -> act -> Event + log + metric). Off by default;
see docs/agent.md "Remediation".
"""
