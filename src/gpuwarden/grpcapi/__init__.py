"""Kubelet gRPC APIs (device plugin v1beta1, pod-resources v1) and deadline-bound clients.

Nothing is imported here so that importing the package stays cheap; the
generated modules pull in grpc/protobuf and are loaded only when a call is made.
"""
