# syntax=docker/dockerfile:1
# The gateway: the stateless public API on port 8080 (no engine, no GPU). Run many.
# Build from the repository root:
#   docker build -f deploy/gateway.Dockerfile -t voicehost-gateway .
FROM python:3.11-slim

ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv

# The dependencies in their own layer, read from pyproject.toml (no engine extra) and pinned by the
# CPU lock; torch==2.13.0+cpu comes from the PyTorch CPU index (PyPI carries only CUDA builds).
WORKDIR /src
COPY pyproject.toml ./
COPY locks/cpu.txt ./locks/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir --upgrade pip \
 && pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
      -c locks/cpu.txt -r /tmp/requirements.txt

COPY README.md ./
COPY voicehost ./voicehost
COPY lora_training ./lora_training
# The speaker embedder, without its declared deps (as the Makefile installs it; see pyproject.toml).
RUN pip install --no-cache-dir --no-deps . "resemblyzer==0.1.4" \
 && python -c "import voicehost.cli" \
 && rm -rf /src /tmp/requirements.txt

# The same uid as the worker image, so both can write the shared volume.
RUN groupadd --system --gid 10001 voicehost \
 && useradd --system --uid 10001 --gid voicehost --create-home --home-dir /home/voicehost voicehost \
 && mkdir -p /srv/voicehost/shared \
 && chown -R voicehost:voicehost /srv/voicehost
ENV VOICEHOST_HOST=0.0.0.0 \
    VOICEHOST_PORT=8080 \
    VOICEHOST_SHARED_DIR=/srv/voicehost/shared
USER 10001:10001
WORKDIR /srv/voicehost

EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('VOICEHOST_PORT', '8080'), timeout=4)"
CMD ["voicehost", "gateway"]
