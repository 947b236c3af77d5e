#!/usr/bin/env bash
# The NCCL probe on the 2 x H200 test machine (docs/h200/nccl-2026-11-30/README.md):
#  1. a hang recording for the hang detection (docs/h200/hang-recording-2026-11-30/record_hang.py);
#  2. intra-node (NVLink): the probe (eager and CUDA-graph timing) beside nccl-tests, same NCCL, same sizes;
#  3. two "nodes" on one host: two agents, one GPU each, P2P and shared memory off so NCCL uses its socket
#     transport as between nodes without IB; the head's `dgxdoctor check --only nccl` asks the peer's daemon to
#     join over the API (full and quick mode, wall time), and nccl-tests with the same environment;
#  4. the quick mode on both GPUs of one node (wall time).
# Expects in $D: wheels/ (dgxdoctor and the dependencies the machine lacks) and nccl-tests/ (the NVIDIA/nccl-tests
# sources: Makefile, src, verifiable, os); OUT set. Results in /tmp/r, tarred into $OUT at the end.
# SMALL=1: only 1-64 MiB over NVLink, three rounds each side; HANG=0: without the hang recording.
set -u
D=${D:-.dev/nccl}
R=/tmp/r
mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$D"/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site
{ date -u; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$R/when.txt"
stamp() { echo "$(date -u +%T) $*" | tee -a "$R/when.txt"; }

# nccl-tests against the same NCCL as torch, built while the hang is recorded
LIB=$(python3 -c 'import glob, site, os; print(next(os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(os.path.join(s, "nvidia", "**", "libnccl.so.2"), recursive=True)))')
ln -sf libnccl.so.2 "$LIB/libnccl.so"
export LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}"
(cd "$D/nccl-tests" && make -j16 MPI=0 CUDA_HOME=/usr/local/cuda NCCL_HOME="$(dirname "$LIB")" BUILDDIR=/tmp/nt \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > "$R/nccl-tests-build.log" 2>&1
 echo "build exit $?" >> "$R/nccl-tests-build.log") &
BUILD=$!

if [ "${SMALL:-0}" = 1 ]; then  # only the small sizes on NVLink, three rounds each side, interleaved
    wait $BUILD; tail -1 "$R/nccl-tests-build.log"
    NT=$(find /tmp/nt -name all_reduce_perf -type f | head -1)
    for i in 1 2 3; do
        timeout 60 python3 /tmp/site/dgxdoctor/probes/allreduce.py --min-bytes 1M --max-bytes 64M \
            > "$R/probe-small-$i.txt" 2> "$R/probe-small-$i.err"
        timeout 60 $NT -b 1M -e 64M -f 2 -g 2 > "$R/nccl-tests-small-$i.txt" 2>&1
    done
    python3 benchmarks/nccl_vs_nccl_tests.py --probe "$R"/probe-small-?.txt --nccl-tests "$R"/nccl-tests-small-?.txt \
        | tee "$R/summary-small.txt"
    tar czf "$OUT/nccl-run.tgz" -C "$R" .
    exit 0
fi
if [ "${HANG:-1}" = 1 ]; then
    stamp hang-recording
    timeout 120 python3 docs/h200/hang-recording-2026-11-30/record_hang.py "$R/hang" > "$R/hang.log" 2>&1; stamp "hang exit $?"
fi

P="python3 /tmp/site/dgxdoctor/probes/allreduce.py"
stamp probe-nvlink
for t in eager graph; do
    timeout 120 $P --min-bytes 1M --max-bytes 64M --timing $t > "$R/probe-nvlink-$t.txt" 2> "$R/probe-nvlink-$t.err"
done
for i in 1 2; do
    timeout 180 $P --min-bytes 1M --max-bytes 8G > "$R/probe-nvlink-$i.txt" 2> "$R/probe-nvlink-$i.err"
done
wait $BUILD; tail -1 "$R/nccl-tests-build.log"
NT=$(find /tmp/nt -name all_reduce_perf -type f | head -1)
stamp nccl-tests-nvlink
for i in 1 2; do timeout 120 $NT -b 1M -e 8G -f 2 -g 2 > "$R/nccl-tests-nvlink-$i.txt" 2>&1; done
timeout 120 $NT -b 1M -e 8G -f 2 -g 2 -G 1 > "$R/nccl-tests-nvlink-graph.txt" 2>&1

# two "nodes": an agent per GPU, sockets between them
TOKEN=h200-nccl-token-0123456789
printf 'export NCCL_P2P_DISABLE=1\nexport NCCL_SHM_DISABLE=1\nexport NCCL_SOCKET_IFNAME=lo\nexport NCCL_NVLS_ENABLE=0\n' > "$R/nccl.sh"
node_cfg() {  # name, listen port, extra nccl keys
    mkdir -p "/tmp/$1"
    printf 'node = "%s"\n[daemon]\nlisten = "127.0.0.1:%s"\ntoken = "%s"\n[paths]\nstate_dir = "/tmp/%s/state"\n[checks.nccl]\nserving_python = "python3"\ngpus = 1\nvllm_url = ""\nenv_file = "%s"\nmin_bytes = "1M"\nmax_bytes = "512M"\n%b' \
        "$1" "$2" "$TOKEN" "$1" "$R/nccl.sh" "$3" > "/tmp/$1/config.toml"
}
node_cfg peer 9836 ""
CUDA_VISIBLE_DEVICES=1 python3 -m dgxdoctor run --config /tmp/peer/config.toml > "$R/peer-daemon.log" 2>&1 &
PEER=$!
for _ in $(seq 60); do python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:9836/healthz")' 2>/dev/null && break; sleep 0.5; done
head_run() {  # label, extra nccl keys
    node_cfg "head-$1" 9835 "peer = \"http://127.0.0.1:9836\"\nmaster_addr = \"127.0.0.1\"\nmaster_port = $((29600 + RANDOM % 300))\n$2"
    t0=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m dgxdoctor check --only nccl --json --config "/tmp/head-$1/config.toml" \
        > "$R/check-$1.json" 2> "$R/check-$1.err"
    code=$?
    echo "$1 wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))") exit=$code" | tee -a "$R/walls.txt"
    cp "/tmp/head-$1/state/nccl/last-probe.txt" "$R/probe-socket-$1-head.txt" 2>/dev/null
    cp /tmp/peer/state/nccl/last-probe.txt "$R/probe-socket-$1-peer.txt" 2>/dev/null
}
stamp socket-cross-node
head_run full-1 ""
head_run full-2 ""
head_run quick-cross-node 'quick = true\n'
head_run quick-cross-node-2 'quick = true\n'
kill $PEER; wait $PEER
stamp nccl-tests-socket
for i in 1 2; do
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_DEBUG=INFO \
        NCCL_DEBUG_SUBSYS=INIT,NET timeout 120 $NT -b 1M -e 512M -f 2 -g 2 > "$R/nccl-tests-socket-$i.txt" 2>&1
done
stamp quick-one-node
mkdir -p /tmp/one
printf 'node = "one"\n[paths]\nstate_dir = "/tmp/one/state"\n[checks.nccl]\nserving_python = "python3"\nvllm_url = ""\nquick = true\n' \
    > /tmp/one/config.toml
for i in 1 2; do
    t0=$(date +%s.%N)
    timeout 120 python3 -m dgxdoctor check --only nccl --json --config /tmp/one/config.toml > "$R/check-quick-one-node-$i.json" 2>&1
    code=$?
    echo "quick-one-node-$i wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))") exit=$code" | tee -a "$R/walls.txt"
done
cp /tmp/one/state/nccl/last-probe.txt "$R/probe-quick-one-node.txt" 2>/dev/null
sed -i '/^quick = true$/d' /tmp/one/config.toml  # the default sizes (8M-1G), as measured before this work
t0=$(date +%s.%N)
timeout 120 python3 -m dgxdoctor check --only nccl --json --config /tmp/one/config.toml > "$R/check-default-one-node.json" 2>&1
code=$?
echo "default-one-node wall_s=$(python3 -c "print(round($(date +%s.%N) - $t0, 2))") exit=$code" | tee -a "$R/walls.txt"
stamp done
B="python3 benchmarks/nccl_vs_nccl_tests.py"
{
    echo "== NVLink, probe (direct NCCL calls, the default) vs nccl-tests"; $B --probe "$R"/probe-nvlink-[12].txt --nccl-tests "$R"/nccl-tests-nvlink-[12].txt
    echo "== NVLink, probe (torch all_reduce in a CUDA graph) vs nccl-tests"; $B --probe "$R/probe-nvlink-graph.txt" --nccl-tests "$R"/nccl-tests-nvlink-[12].txt
    echo "== NVLink, probe (torch all_reduce, eager) vs nccl-tests"; $B --probe "$R/probe-nvlink-eager.txt" --nccl-tests "$R"/nccl-tests-nvlink-[12].txt
    echo "== NVLink, nccl-tests round 2 vs round 1 (the noise floor)"; $B --probe "$R/nccl-tests-nvlink-2.txt" --nccl-tests "$R/nccl-tests-nvlink-1.txt"
    echo "== sockets, two agents vs nccl-tests"; $B --probe "$R"/probe-socket-full-[12]-head.txt --nccl-tests "$R"/nccl-tests-socket-[12].txt --wall "$R/walls.txt"
    echo "== sockets, nccl-tests round 2 vs round 1 (the noise floor)"; $B --probe "$R/nccl-tests-socket-2.txt" --nccl-tests "$R/nccl-tests-socket-1.txt"
} > "$R/summary.txt" 2>&1
cat "$R/summary.txt" "$R/walls.txt" "$R/hang/summary.txt" 2>/dev/null
tar czf "$OUT/nccl-run.tgz" -C "$R" .
cp "$R/summary.txt" "$OUT/"
