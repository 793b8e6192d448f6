# The dsv4-operator image: `dsv4 run` on a slim Python 3.11, as a non-root user.
#   docker build -t registry.example.com/dsv4-operator:0.1.0 .
# The chart (charts/dsv4-operator) runs it with a read-only root filesystem and /tmp on an
# emptyDir. Dependencies are the exact pins of pyproject.toml's [project] dependencies.
# The wheel holds dsv4_operator only; the dev control plane and the demo live in testsupport/,
# a separate distribution that is never copied in (.dockerignore).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# Wheels for the operator and its pinned dependencies, installed into an isolated prefix.
RUN python -m venv /opt/dsv4 \
    && /opt/dsv4/bin/pip install --no-compile . \
    && /opt/dsv4/bin/python -c "import dsv4_operator.cli"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dsv4-operator" \
      org.opencontainers.image.description="Kubernetes operator for DeepSeek-V4 on SGLang with PD disaggregation" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/dsv4/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /opt/dsv4 /opt/dsv4
# 65532: the conventional "nonroot" uid/gid; no shell login, no home directory to write to.
RUN groupadd --system --gid 65532 dsv4 \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin dsv4
USER 65532:65532
EXPOSE 8080 8081 9443
ENTRYPOINT ["dsv4"]
CMD ["run"]
