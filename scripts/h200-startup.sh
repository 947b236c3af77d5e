#!/usr/bin/env bash
# Start-up and resident memory on the one-GPU H200 test machine (kind nvidia-h200), in one call, of dgxdoctor as
# the README installs it on a node without internet access: a virtual environment of its own, installed from a
# wheelhouse alone (carried in .whl/house/: this checkout's wheel and its dependencies' wheels for the machine's
# Python; `scripts/h200-wheelhouse` builds it). Then benchmarks/startup.py with real NVML beside `nvidia-smi -L`,
# and the installed daemon's resident memory after 45 s with every default check (its largest mappings too).
# The same daemon run by the machine's own python3 (an image with torch, rich, pygments and a numba .pth on its
# path, the dependencies it lacks in /tmp/site) is measured beside it, to show what a crowded interpreter adds.
# OUT: the results folder.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
venv=/tmp/dgxdoctor
{
    # The README's offline install. The image's python3 is itself a venv's: the new one is made from the base
    # interpreter it points to; --without-pip because that base has no ensurepip, so the outer pip installs into it.
    base=$(python3 -c 'import sys; print(sys._base_executable)')
    "$base" -m venv --without-pip "$venv" || python3 -m venv --without-pip "$venv"
    python3 -m pip --python "$venv/bin/python" install -q --no-index --find-links .whl/house dgxdoctor
    "$venv/bin/python" -m pip --version 2>/dev/null || true
    python3 -m pip --python "$venv/bin/python" list 2>/dev/null
} > "$OUT/install.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/house/*.whl > "$OUT/pip.txt" 2>&1
cfg=docs/h200/h200-config.toml
{
    date -u; nvidia-smi -L; "$venv/bin/python" --version
    # --python: that interpreter with this checkout's src first on the path, the same code as the wheel installed
    # from it (the machine has no network to build the cached venv that startup.py measures by default)
    "$venv/bin/python" benchmarks/startup.py --runs 9 --peer "nvidia-smi -L" --check-target 0.6 --config "$cfg" \
        --python "$venv/bin/python" --check-arg=--skip --check-arg=nccl
    echo "startup exit $?"
    echo; echo "dgxdoctor check, the installed command, once (per-check times):"
    "$venv/bin/dgxdoctor" check --config "$cfg" --skip nccl
} > "$OUT/startup.txt" 2>&1
# idle: every default check, the bandwidth probe off (it is off by default; the test config turns it on)
sed 's/^enabled = true$/enabled = false/' "$cfg" > /tmp/idle.toml
sed -e 's/^listen = .*/listen = "127.0.0.1:9836"/' -e 's|^state_dir = .*|state_dir = "/tmp/dgxdoctor-state-image"|' \
    /tmp/idle.toml > /tmp/idle-image.toml
"$venv/bin/dgxdoctor" run --config /tmp/idle.toml > "$OUT/daemon.log" 2>&1 &
pid=$!
PYTHONPATH="$PWD/src:/tmp/site" python3 -m dgxdoctor run --config /tmp/idle-image.toml > "$OUT/daemon-image.log" 2>&1 &
image_pid=$!
sleep 45
memory() {  # PID: the status lines, then the largest mappings, as benchmarks/daemon_memory.py prints them here
    grep -E 'VmRSS|VmHWM|RssAnon|RssFile' "/proc/$1/status"
    PYTHONPATH=/tmp/site python3 -c \
        "import sys; sys.path.insert(0, 'benchmarks'); from daemon_memory import print_mappings; print_mappings($1)"
}
{ echo "dgxdoctor run, installed ($venv/bin/dgxdoctor):"; memory $pid; } > "$OUT/daemon-memory.txt" 2>&1
{ echo "dgxdoctor run, the image's python3:"; memory $image_pid; } > "$OUT/daemon-memory-image.txt" 2>&1
kill -TERM $pid $image_pid; wait $pid; echo "daemon exit $?" >> "$OUT/daemon-memory.txt"
wait $image_pid; echo "daemon exit $?" >> "$OUT/daemon-memory-image.txt"
cat "$OUT/startup.txt" "$OUT/daemon-memory.txt" "$OUT/daemon-memory-image.txt"
