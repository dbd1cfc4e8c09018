# One image for every Megha process (GM, LM, worker pool, request generator); the
# compose files and the Kubernetes manifests pick the command.  RabbitMQ has its own
# (deploy/images/rabbitmq/Dockerfile).  deploy/README.md has the rest.
#   docker build -t megha:dev .                     # on python:3.11-slim, from Docker Hub
#   docker build --network host --build-arg BASE_IMAGE=megha-base:bookworm -t megha:dev .
#     on any Debian 12 image, e.g. one made by debootstrap with no registry at all
#     (scripts/compose-e2e); --network host where builds get no DNS otherwise
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A bare Debian base has no Python: Debian's own (3.11 on bookworm).  Unpinned: the
# base's suite pins them, and its security updates should come in.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# The project in a virtual environment, built in a stage of its own: what pip needed
# to reach the index (deploy/images/ca/: the build machine's CA bundle, when it sits
# behind a TLS-inspecting proxy) never reaches the image.  The dependencies (and the
# build backend) first, from pyproject.toml alone: a change of the code rebuilds only
# the last layer.
FROM base AS build
WORKDIR /src
COPY deploy/images/ca/ /tmp/ca/
COPY pyproject.toml ./
RUN if [ -f /tmp/ca/ca-certificates.crt ]; then export PIP_CERT=/tmp/ca/ca-certificates.crt; fi \
    && python3 -m venv /opt/megha \
    && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
print("\n".join(p["build-system"]["requires"] + p["project"]["dependencies"]))' > /tmp/requirements.txt \
    && /opt/megha/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY README.md ./
COPY client ./client
COPY common ./common
COPY global_master ./global_master
COPY local_master ./local_master
COPY worker ./worker
COPY runtime ./runtime
COPY security ./security
COPY simulator ./simulator
COPY request_generator ./request_generator
COPY workload ./workload
COPY reporting ./reporting
COPY federation ./federation
COPY chaos ./chaos
COPY testbed ./testbed
COPY megha_cli ./megha_cli
COPY config ./config
RUN /opt/megha/bin/pip install --no-cache-dir --no-deps --no-build-isolation .

FROM base
COPY --from=build /opt/megha /opt/megha
ENV PATH=/opt/megha/bin:$PATH
# /var/lib/megha: where an LM's or pool's state volume is mounted (the compose files);
# writable by whichever uid compose runs it as, as a fresh volume copies this mode.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /app megha \
    && mkdir -p /app/results /var/lib/megha \
    && chown megha:megha /app/results \
    && chmod 1777 /var/lib/megha
WORKDIR /app

# Not root: the Kubernetes manifests run this uid (runAsUser 10001, runAsNonRoot).
USER 10001
CMD ["megha", "--help"]
