# One image for every quota-ledger process: migrate, web (serve), worker and beat differ only in
# their command (see docker-compose.yml).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# The exact, hash-checked dependency set of requirements.lock (how to refresh it: docs/operations.md,
# Reproducible images), in its own layer; then the project itself, built with the locked setuptools.
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml setup.py MANIFEST.in README.md plans.toml ./
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
RUN pip install --no-deps --no-build-isolation . && useradd --system --home /app quota \
    && mkdir -p /var/lib/beat && chown quota /var/lib/beat
USER quota
ENV PLANS_FILE=/app/plans.toml
EXPOSE 8000
ENTRYPOINT []
CMD ["quota-ledger", "serve", "--bind", "0.0.0.0:8000"]
