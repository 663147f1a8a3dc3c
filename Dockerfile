# Slim image running chatgate as a non-root user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY channels ./channels
COPY migrations ./migrations
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOST=0.0.0.0 PORT=8000
RUN useradd --create-home --uid 10001 chatgate
COPY --from=build /install /usr/local
USER chatgate
WORKDIR /home/chatgate
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/readyz'); sys.exit(0)"
# `serve` waits for the database and runs migrations (AUTO_MIGRATE=true) before serving.
CMD ["chatgate", "serve"]
