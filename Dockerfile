# One image for every quota-ledger process: migrate, web (serve), worker and beat differ only in
# their command (see docker-compose.yml).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md plans.toml ./
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
RUN pip install . && useradd --system --home /app quota && mkdir -p /var/lib/beat && chown quota /var/lib/beat
USER quota
ENV PLANS_FILE=/app/plans.toml
EXPOSE 8000
ENTRYPOINT []
CMD ["quota-ledger", "serve", "--bind", "0.0.0.0:8000"]
