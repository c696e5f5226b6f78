# gpulens: one image for every role (exporter, collector, dashboard); the command picks the role.
#
#   docker build -t gpulens .
#   docker run --rm gpulens --help
#
# Stage 1 builds the gpulens wheel and installs it with its dependencies into a virtual environment; stage 2 copies
# only that environment onto a slim Python and runs as an unprivileged user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/gpulens \
 && /opt/gpulens/bin/pip install "$(echo /wheels/gpulens-*.whl)[k8s]"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="gpulens" \
      org.opencontainers.image.description="Monitoring and observability for NVIDIA GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/gpulens/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 gpulens \
 && useradd --system --uid 10001 --gid gpulens --home-dir /var/lib/gpulens --shell /usr/sbin/nologin gpulens \
 && install -d -o gpulens -g gpulens -m 0750 /var/lib/gpulens /var/lib/gpulens/spool /var/lib/gpulens/alerts
COPY --from=build /opt/gpulens /opt/gpulens
# Scenario files for `gpulens exporter --source sim` (the compose file's `sim` profile). examples/scenarios/demo.toml
# is a link to the copy bundled in the package (.dockerignore leaves the link out), so the file itself is copied.
COPY examples/scenarios /usr/share/gpulens/scenarios
COPY gpulens/scenarios/demo.toml /usr/share/gpulens/scenarios/demo.toml
USER 10001:10001
WORKDIR /var/lib/gpulens
# 9410: exporter, 9411: collector's own metrics, 8050: dashboard.
EXPOSE 9410 9411 8050
ENTRYPOINT ["gpulens"]
CMD ["exporter"]
