#!/usr/bin/env bash
# A tensor-parallel stall with one rank stopped, on the two-GPU H200 test machine (kind nvidia-h200-x2), in one call
# (issue: "On two GPUs: a tensor-parallel stall with one rank stopped, recorded and judged end to end"):
#  - two "nodes" on one host as in docs/h200/nccl-2026-11-30/: an agent per GPU (head: GPU 0, port 9835; peer:
#    GPU 1, port 9836), NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo so NCCL uses its network
#    transport; each rank's RAS on its own address (NCCL_RAS_ADDR 127.0.0.1:28028 for rank 0, :28038 for rank 1),
#    each agent's ras check reading its node's;
#  - a two-rank communicator (scripts/h200_ras/job.py) all-reducing in a loop in the machine's torch Python;
#  - three rounds: 20 s healthy, SIGSTOP rank 1, RAS read from both sides (bytes and parsed data) during the stall,
#    GPU samples of both GPUs every 0.5 s, both agents' /state polled every 0.5 s with timestamps; the time from
#    the stop until the head's agent names the stopped rank (its GPU and "node"); SIGCONT, the time until the
#    finding clears; the agents run in observe mode, nothing is restarted (the remediation audit is kept).
# Expects in $D (default .dev/ras): wheels/ with the dependency wheels the machine lacks (msgspec, google-re2,
# typing-extensions ... as for scripts/h200-run.sh; a dgxdoctor wheel there is shadowed by the tree's src/)
# (as scripts/h200-nccl.sh). OUT: the results folder. Results in /tmp/rs, tarred into $OUT/ras-stall.tgz;
# $OUT/summary.txt and $OUT/timings.txt beside it.
set -u
D=${D:-.dev/ras}
R=/tmp/rs
rm -rf "$R"; mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$D"/wheels/*.whl \
    || exit 1
export PYTHONPATH="$PWD/src:/tmp/site"  # the tree's dgxdoctor first, the dependency wheels after
stamp() { echo "$(date -u +%T.%N | cut -c1-12) $*" | tee -a "$R/when.txt"; }
{ date -u; nvidia-smi -L; "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } \
    > "$R/when.txt" 2>&1
NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0"
TOKEN=h200-ras-token-0123456789

node_cfg() {  # name, listen port, GPU, RAS port, extra
    mkdir -p "/tmp/$1"
    cat > "/tmp/$1/config.toml" <<EOF
node = "$1"
[paths]
state_dir = "/tmp/$1/state"
[daemon]
listen = "127.0.0.1:$2"
token = "$TOKEN"
$5
[checks.gpu]
interval_s = 1.0
expected_count = 0
[checks.ras]
interval_s = 2.0
address = "127.0.0.1:$4"
collective_timeout_s = 2
deadline_s = 8.0
tensor_parallel_size = 2
required = true
[checks.peer_compare]
interval_s = 2.0
[checks.nccl]
enabled = false
[checks.vllm]
enabled = false
EOF
}
node_cfg head 9835 0 28028 'peers = ["http://127.0.0.1:9836"]'
node_cfg peer 9836 1 28038 ''
"$PY" -m dgxdoctor run --config /tmp/head/config.toml > "$R/head-daemon.log" 2>&1 &
HEAD=$!
"$PY" -m dgxdoctor run --config /tmp/peer/config.toml > "$R/peer-daemon.log" 2>&1 &
PEER=$!

# the two-rank communicator: rank 0 on GPU 0 (head), rank 1 on GPU 1 (peer)
mkdir -p "$R/job"
for rank in 0 1; do
    env $NET CUDA_VISIBLE_DEVICES=$rank RANK=$rank WORLD_SIZE=2 MASTER_PORT=29620 NCCL_DEBUG=INFO \
        NCCL_DEBUG_SUBSYS=INIT,NET,RAS NCCL_RAS_ADDR=127.0.0.1:$((28028 + 10 * rank)) \
        "$PY" scripts/h200_ras/job.py "$R/job" > "$R/rank$rank.log" 2>&1 &
    eval "RANK$rank=\$!"
done
for _ in $(seq 240); do [ -s "$R/job/rank0.json" ] && [ -s "$R/job/rank1.json" ] && break; sleep 0.5; done
stamp "job ready: $(cat "$R/job/rank0.json" "$R/job/rank1.json" 2>/dev/null | tr '\n' ' ')"

# background samplers: both GPUs via nvidia-smi every 0.5 s; both agents' /state every 0.5 s
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,power.draw,memory.used \
    --format=csv -lms 500 > "$R/gpu-samples.csv" 2>&1 &
SMI=$!
"$PY" - "$R" "$TOKEN" > "$R/poller.log" 2>&1 <<'EOF' &
import json, sys, time, urllib.request
out, token = sys.argv[1], sys.argv[2]
def get(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/state", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.load(r)
    except Exception as exc:
        return {"error": str(exc)}
with open(f"{out}/findings.jsonl", "w") as f:
    while True:
        for name, port in (("head", 9835), ("peer", 9836)):
            state = get(port)
            found = [{"check": c.get("name"), "status": c.get("status"), **x} for c in state.get("checks", [])
                     for x in c.get("findings", []) if c.get("name") in ("ras", "peer_compare", "gpu")]
            f.write(json.dumps({"t": time.time(), "node": name, "error": state.get("error"), "findings": found}) + "\n")
        f.flush()
        time.sleep(0.5)
EOF
POLL=$!

read_both() {  # label: RAS from both sides at once, dgxdoctor's reader; the raw recorder on rank 0's side
    pids=""
    for side in 0 1; do
        timeout 20 "$PY" scripts/h200_ras/read.py --host 127.0.0.1 --port $((28028 + 10 * side)) --deadline 12 \
            > "$R/ras-$1-rank$side.json" 2>&1 &
        pids="$pids $!"
    done
    timeout 30 "$PY" scripts/h200_ras/record.py sessions "$R/raw-$1" --port 28028 --label "$1-rank0" --deadline 12 \
        > /dev/null 2>&1
    wait $pids
}

sleep 20
read_both healthy
cp /tmp/head/state/remediation* "$R/" 2>/dev/null
for round in 1 2 3; do
    stamp "round $round: SIGSTOP rank 1 (pid $RANK1)"
    t0=$(date +%s.%N); echo "$round stop $t0" >> "$R/events.txt"
    kill -STOP "$RANK1"
    sleep 8
    [ "$round" = 1 ] && read_both "stalled-r1"
    # wait (up to 40 s) for the head's agent: RAS naming rank 1, then the joined finding naming its node and GPU;
    # the waiting rank 0 must never be blamed
    "$PY" - "$R" "$t0" "$round" >> "$R/timings.txt" <<'EOF'
import json, sys, time
out, t0, rnd = sys.argv[1], float(sys.argv[2]), sys.argv[3]
first = {}
blamed = []
deadline = t0 + 40
while time.time() < deadline and "joined" not in first:
    for line in open(f"{out}/findings.jsonl"):
        row = json.loads(line)
        if row["t"] < t0 or row["node"] != "head":
            continue
        for f in row["findings"]:
            code, msg = f.get("code", ""), f.get("message", "")
            if code.startswith("RAS_RANK") and msg.startswith("rank 1 "):
                first.setdefault("ras", (row["t"] - t0, code, msg))
            if code == "PEER_TP_RANK_STUCK" and msg.startswith("rank 1 on peer, GPU 1"):
                first.setdefault("joined", (row["t"] - t0, code, msg))
            if code.startswith(("RAS_RANK", "PEER_TP_RANK")) and msg.startswith("rank 0 "):
                blamed.append(msg)
    time.sleep(0.5)
for what in ("ras", "joined"):
    got = first.get(what)
    print(f"round {rnd} {what}_named_after_s {got[0]:.2f} code {got[1]} message {got[2]!r}" if got
          else f"round {rnd} {what}_named_after_s none (not within 40 s)")
print(f"round {rnd} waiting_rank_blamed {'yes: ' + blamed[0] if blamed else 'no'}")
EOF
    stamp "round $round: named (see timings.txt)"
    t1=$(date +%s.%N); echo "$round cont $t1" >> "$R/events.txt"
    kill -CONT "$RANK1"
    stamp "round $round: SIGCONT"
    sleep 15
    [ "$round" = 1 ] && read_both "resumed-r1"
done
kill "$POLL" "$SMI"
"$PY" - "$R" >> "$R/timings.txt" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
for what in ("ras", "joined"):
    named = [float(l.split()[3]) for l in open(f"{out}/timings.txt") if f" {what}_named_after_s " in l and "none" not in l]
    if named:
        print(f"time to name the stopped rank ({what}): p50 {statistics.median(named):.2f} s, max {max(named):.2f} s "
              f"over {len(named)} round(s)")
# cleared: after each SIGCONT, the first head row without a rank finding
events = [l.split() for l in open(f"{out}/events.txt")]
rows = [json.loads(l) for l in open(f"{out}/findings.jsonl")]
for rnd, kind, t in events:
    if kind != "cont":
        continue
    t = float(t)
    clear = next((r["t"] - t for r in rows if r["t"] > t and r["node"] == "head" and not any(
        f.get("code", "").startswith(("RAS_RANK", "PEER_TP_RANK")) for f in r["findings"])), None)
    print(f"round {rnd} cleared_after_s {clear if clear is None else round(clear, 2)}")
EOF
kill -0 "$RANK0" && kill -0 "$RANK1" && echo "both ranks alive after three rounds (nothing restarted)" >> "$R/timings.txt"
cat "$R/job"/rank*.progress >> "$R/timings.txt" 2>/dev/null
for n in head peer; do cp -r "/tmp/$n/state" "$R/state-$n" 2>/dev/null; done
kill "$RANK0" "$RANK1" "$HEAD" "$PEER"
wait "$HEAD" "$PEER" 2>/dev/null
stamp done
{ cat "$R/when.txt"; echo "== timings"; cat "$R/timings.txt"; echo "== head findings during round 1";
  grep '"head"' "$R/findings.jsonl" | grep -m 5 RAS_RANK; } > "$R/summary.txt" 2>&1
tar czf "$OUT/ras-stall.tgz" -C "$R" .
cp "$R/summary.txt" "$R/timings.txt" "$OUT/" 2>/dev/null
cat "$R/summary.txt" | head -80
