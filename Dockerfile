# gpuwarden: the CLI, the DaemonSet agent and the controller (deploy/helm/gpuwarden, deploy/manifests).
#   docker build -t ghcr.io/gpuwarden/gpuwarden:0.1.0 .          (or: buildah bud, podman build)
# Debian's python3 on debian:bookworm-slim: the same packages CI builds this file from
# (tools/image/build.sh makes that base with mmdebstrap where no registry is reachable),
# with Debian's security updates for the interpreter. docs/image.md says how it is built and run.
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS python
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log

FROM python AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3-venv
COPY pyproject.toml README.md MANIFEST.in /src/
COPY src /src/src
# a wheel from the source, installed with its dependencies into a venv that the last stage copies.
# Behind a TLS-intercepting proxy, pass its CA bundle as a build secret (never a layer):
#   --secret id=cacert,src=/etc/ssl/certs/ca-certificates.crt
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert; fi \
 && python3 -m venv /opt/gpuwarden \
 && /opt/gpuwarden/bin/pip install --no-cache-dir --disable-pip-version-check /src \
 && /opt/gpuwarden/bin/pip uninstall -y -q pip setuptools

FROM python
# no compiler, no shell tools needed at run time; NVML comes from the host driver (NVIDIA runtime)
COPY --from=build /opt/gpuwarden /opt/gpuwarden
ENV PATH=/opt/gpuwarden/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["gpuwarden"]
CMD ["agent", "--config", "/etc/gpuwarden/agent.yaml"]
