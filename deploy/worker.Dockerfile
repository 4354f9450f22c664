# syntax=docker/dockerfile:1
# A GPU worker: the vLLM engine, the SNAC decoder and the worker HTTP API on port 8080.
# Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t voicehost-worker .
# The locked torch and vLLM wheels bring their own CUDA libraries (CUDA 13: driver >= 580, or an
# older one with the forward-compatibility package); the base image only supplies the runtime.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04
FROM ${CUDA_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
# Python 3.11 from deadsnakes. gcc and the Python headers stay: Triton (under vLLM) compiles
# small launcher stubs at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gnupg software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv python3.11-dev gcc libc6-dev \
 && apt-get purge -y --auto-remove software-properties-common gnupg \
 && rm -rf /var/lib/apt/lists/*

RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# The dependencies (with the `gpu` extra: vllm) in their own layer, read from pyproject.toml and
# pinned by the GPU lock (what `make serve` installs on a GPU machine), so a code change does not
# reinstall vLLM and torch, and the image holds the versions the project was tested with.
WORKDIR /src
COPY pyproject.toml ./
COPY locks/gpu.txt ./locks/
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['gpu']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir --upgrade pip \
 && pip install --no-cache-dir -c locks/gpu.txt -r /tmp/requirements.txt

COPY README.md ./
COPY voicehost ./voicehost
COPY lora_training ./lora_training
# The speaker embedder, without its declared deps (as the Makefile installs it; see pyproject.toml).
RUN pip install --no-cache-dir --no-deps ".[gpu]" "resemblyzer==0.1.4" \
 && python -c "import vllm, voicehost.cli" \
 && rm -rf /src /tmp/requirements.txt

# One non-root user (the same uid in the gateway image, so both can write the shared volume).
RUN groupadd --system --gid 10001 voicehost \
 && useradd --system --uid 10001 --gid voicehost --create-home --home-dir /home/voicehost voicehost \
 && mkdir -p /srv/voicehost/shared /var/cache/voicehost/adapters /var/cache/huggingface \
 && chown -R voicehost:voicehost /srv/voicehost /var/cache/voicehost /var/cache/huggingface
ENV HF_HOME=/var/cache/huggingface \
    VOICEHOST_HOST=0.0.0.0 \
    VOICEHOST_PORT=8080 \
    VOICEHOST_SHARED_DIR=/srv/voicehost/shared \
    VOICEHOST_ADAPTER_CACHE_DIR=/var/cache/voicehost/adapters
USER 10001:10001
WORKDIR /srv/voicehost

EXPOSE 8080
# Liveness only: /healthz is 200 while loading and serving, 503 once the engine died.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('VOICEHOST_PORT', '8080'), timeout=4)"
CMD ["voicehost", "worker"]
