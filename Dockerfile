# Slim image running chatgate as a non-root user. The base image is a build argument
# (`--build-arg BASE_IMAGE=...`), so a locally made base (see docs/docker.md) works where
# no image registry is reachable. Any base with python3 (>= 3.11) and its venv module fits.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
# Imported bases have no PATH of their own.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /src
# Extra CA certificates (a TLS-intercepting proxy on the way to PyPI), build stage only:
# docker/build-ca/*.crt, put there by scripts/docker-e2e.sh; none in the final image.
COPY docker/build-ca/ /usr/local/share/ca-certificates/build-ca/
RUN if ls /usr/local/share/ca-certificates/build-ca/*.crt >/dev/null 2>&1; then update-ca-certificates; fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
COPY pyproject.toml README.md ./
COPY app ./app
COPY channels ./channels
COPY migrations ./migrations
# A venv, not `pip install --prefix`: Debian's python3 is "externally managed".
RUN python3 -m venv /opt/venv && pip install --no-cache-dir .

FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOST=0.0.0.0 PORT=8000
RUN useradd --create-home --uid 10001 chatgate
COPY --from=build /opt/venv /opt/venv
USER chatgate
WORKDIR /home/chatgate
EXPOSE 8000
# Follows PORT, not a fixed 8000.
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python3 -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('PORT', '8000'), timeout=2)"
# `serve` waits for the database and runs migrations (AUTO_MIGRATE=true) before serving.
CMD ["chatgate", "serve"]
