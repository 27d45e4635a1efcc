# One image for every batchfleet process: batcher, worker, demo.
# For GPU workers build FROM an NVIDIA CUDA runtime image with Python 3.11 instead.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY config ./config
COPY producer ./producer
COPY workers ./workers
RUN pip install . && useradd --create-home --uid 10001 batchfleet
USER batchfleet

ENTRYPOINT ["batchfleet"]
CMD ["--help"]
