# One image for every tiermesh service (tiers, router, gateway, control plane): CPU torch, the
# built-in models inside, runs as a non-root user. The command picks the service, as the
# manifests from `tiermesh mesh k8s` do: python -m services.tier_small | services.router | ...
#
#   docker build -t tiermesh:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/tiermesh \
 && /opt/tiermesh/bin/pip install "setuptools>=68" "wheel>=0.43" "grpcio-tools>=1.85,<2" \
 && /opt/tiermesh/bin/pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && /opt/tiermesh/bin/pip install "xds-protos==1.85.0"
COPY protos/ protos/
COPY clients/python/ clients/python/
RUN /opt/tiermesh/bin/pip install --no-build-isolation ./clients/python
COPY pyproject.toml README.md ./
COPY services/ services/
COPY mesh/ mesh/
RUN /opt/tiermesh/bin/pip install --no-build-isolation ".[mesh]" \
 && /opt/tiermesh/bin/python -c "import services.router, services.tier, mesh.control_plane"

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 tiermesh \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin tiermesh
COPY --from=build /opt/tiermesh /opt/tiermesh
ENV PATH=/opt/tiermesh/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface \
    TIERMESH_RUN_DIR=/tmp/tiermesh \
    TIERMESH_METRICS_HOST=0.0.0.0
WORKDIR /opt/tiermesh
USER 10001:10001
EXPOSE 50051 50061 50062 50063 50081 8080 9464
CMD ["python", "-m", "services.router", "--host", "0.0.0.0"]
