# One image for every Megha process (GM, LM, worker pool, request generator);
# docker-compose.yml picks the command.  RabbitMQ runs from its own image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md* ./
COPY common ./common
COPY global_master ./global_master
COPY local_master ./local_master
COPY worker ./worker
COPY simulator ./simulator
COPY request_generator ./request_generator
COPY megha_cli ./megha_cli
COPY config ./config
RUN pip install --no-cache-dir .
CMD ["megha", "--help"]
