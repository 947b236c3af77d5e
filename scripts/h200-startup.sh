#!/usr/bin/env bash
# Start-up and resident memory on the one-GPU H200 test machine (kind nvidia-h200), in one call: the dependency
# wheels the machine lacks (carried in .whl/) into /tmp/site, then benchmarks/startup.py with real NVML beside
# `nvidia-smi -L`, then the daemon's resident memory after 45 s with every default check. OUT: the results folder.
# startup.py gets `--python python3`: this machine's own interpreter with src and /tmp/site on PYTHONPATH (it has
# no network to build the installed venv that startup.py measures by default).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/pip.txt" 2>&1
export PYTHONPATH="$PWD/src:/tmp/site"
cfg=docs/h200/h200-config.toml
{
    date -u; nvidia-smi -L; python3 --version
    python3 benchmarks/startup.py --python python3 --runs 9 --peer "nvidia-smi -L" --check-target 0.6 --config "$cfg" \
        --check-arg=--skip --check-arg=nccl
    echo "startup exit $?"
} > "$OUT/startup.txt" 2>&1
# idle: every default check, the bandwidth probe off (it is off by default; the test config turns it on)
sed 's/^enabled = true$/enabled = false/' "$cfg" > /tmp/idle.toml
python3 -m dgxdoctor run --config /tmp/idle.toml > "$OUT/daemon.log" 2>&1 &
pid=$!
sleep 45
grep -E 'VmRSS|VmHWM|RssAnon|RssFile' /proc/$pid/status > "$OUT/daemon-memory.txt"
# where it goes: the largest mappings (anonymous, heap, each .so), as benchmarks/daemon_memory.py prints them here
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from daemon_memory import print_mappings; print_mappings($pid)" \
    >> "$OUT/daemon-memory.txt" 2>&1
kill -TERM $pid; wait $pid; echo "daemon exit $?" >> "$OUT/daemon-memory.txt"
cat "$OUT/startup.txt" "$OUT/daemon-memory.txt"
