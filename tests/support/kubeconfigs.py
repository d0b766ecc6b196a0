"""Kubeconfigs for tests that need the Kubernetes client to meet a particular API server."""

#: an API server that does not answer at all (a closed loopback port): connection refused, `HTTP 0`
UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: gw, user: {token: "none"}}]
contexts: [{name: gone, context: {cluster: gone, user: gw}}]
current-context: gone
"""
