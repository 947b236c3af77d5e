#!/usr/bin/env bash
# NCCL's RAS client protocol recorded on the one-GPU H200 test machine (kind nvidia-h200), in one call:
#  1. a one-rank torch NCCL communicator (scripts/h200_ras/job.py) running all-reduces in the machine's torch
#     Python (/opt/torch/.venv/bin/python, else python3), RAS on 127.0.0.1:28028 as NCCL sets it up by default;
#  2. the raw recorder (scripts/h200_ras/record.py) talking to it: one connection per command sequence, every
#     chunk both ways with its time (STATUS, VERBOSE STATUS, SET FORMAT json, the default timeout, bad commands,
#     MONITOR for 3 s);
#  3. dgxdoctor's reader (scripts/h200_ras/read.py -> sources/ras_client.py + ras_report.py): its exchanges and
#     the parsed data, JSON and text;
#  4. NCCL's own ncclras client, if the NCCL wheel ships it, through the recording proxy (its bytes both ways);
#  5. a second one-rank job with NCCL_RAS_ADDR=127.0.0.1:28031, read there (the address the reader must honour);
#  6. versions (torch, NCCL, driver), NCCL's INFO log of the job.
# Needs nothing beyond the repository: the reader and the recorder are stdlib Python. OUT: the results folder.
# Results in /tmp/ras, tarred into $OUT/ras-recording.tgz; $OUT/summary.txt and the main JSON files beside it.
set -u
R=/tmp/ras
rm -rf "$R"; mkdir -p "$R/state" "$R/state2"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/src"
stamp() { echo "$(date -u +%T.%N | cut -c1-12) $*" | tee -a "$R/when.txt"; }
{
    date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl)' ; echo "PY=$PY"
} > "$R/when.txt" 2>&1
NCCLRAS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
dirs = site.getsitepackages() + ["/usr/bin", "/usr/local/bin", "/usr/local/cuda/bin"]
hits = [p for d in dirs for p in glob.glob(os.path.join(d, "**", "ncclras"), recursive=True) if os.access(p, os.X_OK)]
print(hits[0] if hits else "")
EOF
)
echo "ncclras: ${NCCLRAS:-not shipped by the NCCL wheel}" >> "$R/when.txt"
"$PY" -c 'import glob, os, site; print("\n".join(p for s in site.getsitepackages() for p in glob.glob(os.path.join(s, "nvidia", "nccl", "**"), recursive=True)))' > "$R/nccl-wheel-files.txt" 2>&1

job() {  # statedir, log, master port, extra env; the pid in $LAST
    env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,RAS MASTER_PORT="$3" $4 "$PY" scripts/h200_ras/job.py "$1" > "$2" 2>&1 &
    LAST=$!
}
wait_ready() { for _ in $(seq 120); do [ -s "$1/rank0.json" ] && return 0; sleep 0.5; done; return 1; }

stamp job-start
job "$R/state" "$R/job.log" 29610 ""; JOB=$LAST
wait_ready "$R/state" && stamp "job ready: $(cat "$R/state/rank0.json")" || stamp "job NOT ready"
sleep 2
(ss -ltnp 2>/dev/null || netstat -ltnp 2>/dev/null) | grep -E ':2803[0-9]|:28028' > "$R/listening.txt"
stamp recorder
timeout 120 "$PY" scripts/h200_ras/record.py sessions "$R/raw" --label one-rank > "$R/record.log" 2>&1; stamp "recorder exit $?"
stamp reader
timeout 30 "$PY" scripts/h200_ras/read.py > "$R/read-json.json" 2> "$R/read-json.err"; stamp "reader json exit $?"
timeout 30 "$PY" scripts/h200_ras/read.py --text > "$R/read-text.json" 2> "$R/read-text.err"; stamp "reader text exit $?"
timeout 30 "$PY" scripts/h200_ras/read.py --text --brief > "$R/read-text-brief.json" 2> "$R/read-text-brief.err"
stamp "reader text brief exit $?"
if [ -n "$NCCLRAS" ]; then
    stamp ncclras
    "$NCCLRAS" --version > "$R/ncclras-version.txt" 2>&1
    timeout 60 "$PY" scripts/h200_ras/record.py proxy "$R/raw" --listen 28029 --count 3 > "$R/proxy.log" 2>&1 &
    PROXY=$!
    sleep 1
    timeout 20 "$NCCLRAS" -p 28029 > "$R/ncclras.txt" 2>&1; echo "exit $?" >> "$R/ncclras.txt"
    timeout 20 "$NCCLRAS" -p 28029 -v > "$R/ncclras-v.txt" 2>&1; echo "exit $?" >> "$R/ncclras-v.txt"
    timeout 20 "$NCCLRAS" -p 28029 -f json > "$R/ncclras-json.txt" 2>&1; echo "exit $?" >> "$R/ncclras-json.txt"
    wait $PROXY; stamp "proxy exit $?"
fi
stamp second-job-ras-addr
job "$R/state2" "$R/job2.log" 29611 "NCCL_RAS_ADDR=127.0.0.1:28031"; JOB2=$LAST
wait_ready "$R/state2" && stamp "job2 ready" || stamp "job2 NOT ready"
sleep 2
timeout 30 "$PY" scripts/h200_ras/read.py --host 127.0.0.1 --port 28031 > "$R/read-ras-addr.json" 2>&1
stamp "reader at NCCL_RAS_ADDR exit $?"
(ss -ltnp 2>/dev/null || netstat -ltnp 2>/dev/null) | grep -E ':2803[0-9]|:28028' > "$R/listening-2.txt"
kill "$JOB" "$JOB2"; wait "$JOB" "$JOB2" 2>/dev/null
stamp "jobs stopped"
timeout 10 "$PY" scripts/h200_ras/read.py --port 28028 --deadline 3 > "$R/read-after-stop.json" 2>&1
stamp "reader after the job ended exit $?"
{
    cat "$R/when.txt"; echo; echo "== listening"; cat "$R/listening.txt"
    echo "== reader (json)"; "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d.get(k) for k in ("error", "parse_error")}), json.dumps(d.get("parsed", {}).get("communicators"))[:1500])' "$R/read-json.json"
    echo "== text report"; "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("report_text", ""))' "$R/read-text.json"
    echo "== raw sessions"; head -c 4000 "$R"/raw/one-rank-errors.txt
} > "$R/summary.txt" 2>&1
tar czf "$OUT/ras-recording.tgz" -C "$R" .
cp "$R/summary.txt" "$R/read-json.json" "$R/read-text.json" "$OUT/" 2>/dev/null
cp "$R/raw/one-rank-sessions.json" "$OUT/sessions.json" 2>/dev/null
cat "$R/summary.txt" | head -150
