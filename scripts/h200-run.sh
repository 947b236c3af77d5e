#!/usr/bin/env bash
# What the H200 test machine ran (docs/h200/README.md): the one-shot check, then the daemon for a minute.
# Expects the dependency wheels installed into /tmp/site and OUT set to a folder for the outputs.
set -u
get() { python3 -c "import sys, httpx; r = httpx.get(sys.argv[1], timeout=10); sys.stdout.write(r.text); sys.exit(r.status_code != 200)" "$1"; }
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cfg=docs/h200/h200-config.toml
date -u > "$OUT/when.txt"
python3 -m dgxdoctor check --config "$cfg" --json > "$OUT/check.json" 2> "$OUT/check.stderr"
echo "check --json exit $?" >> "$OUT/when.txt"
python3 -m dgxdoctor check --config "$cfg" --skip nccl -v > "$OUT/check.txt" 2>&1
echo "check table exit $?" >> "$OUT/when.txt"
python3 -m dgxdoctor run --config "$cfg" > "$OUT/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 60); do get http://127.0.0.1:9835/healthz >/dev/null 2>&1 && break; sleep 0.5; done
sleep 40
get http://127.0.0.1:9835/metrics > "$OUT/metrics.prom"
get http://127.0.0.1:9835/state > "$OUT/state.json"
grep -E 'VmRSS|VmHWM' /proc/$pid/status >> "$OUT/when.txt"
kill -TERM $pid; wait $pid; echo "daemon exit $?" >> "$OUT/when.txt"
# The tests that need the real driver (nvidia-smi) and the NVML-facing unit tests, on this machine.
python3 -m pytest -q -p no:cacheprovider tests/integration/test_hostenv_real.py tests/unit/test_gpu.py \
    tests/unit/test_topo.py > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/when.txt"
cat "$OUT/when.txt"; head -c 3000 "$OUT/check.txt"; tail -5 "$OUT/pytest.txt"
