# One image for every Megha process (GM, LM, worker pool, request generator); the
# compose file and the Kubernetes manifests pick the command.  RabbitMQ runs from its
# own image.  Build:  docker build -t megha:dev .   (deploy/README.md has the rest)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY common ./common
COPY global_master ./global_master
COPY local_master ./local_master
COPY worker ./worker
COPY runtime ./runtime
COPY security ./security
COPY simulator ./simulator
COPY request_generator ./request_generator
COPY megha_cli ./megha_cli
COPY config ./config
RUN pip install --no-cache-dir . \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /app megha \
    && mkdir -p /app/results \
    && chown megha:megha /app/results

# Not root: the Kubernetes manifests run this uid (runAsUser 10001, runAsNonRoot).
USER 10001
CMD ["megha", "--help"]
