# gpuwarden: the CLI and the DaemonSet agent (deploy/helm/gpuwarden, deploy/manifests).
#   docker build -t ghcr.io/gpuwarden/gpuwarden:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# no compiler, no shell tools needed at run time; NVML comes from the host driver (NVIDIA runtime)
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["gpuwarden"]
CMD ["agent", "--config", "/etc/gpuwarden/agent.yaml"]
