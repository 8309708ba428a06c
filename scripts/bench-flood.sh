#!/usr/bin/env bash
# One flood of a fresh `breakwater serve` and what followed it: wrk sends
# unique, Stripe-signed 1 KiB webhooks over 32 connections for SECS
# seconds, after IDLE seconds of idle (the store makes its blank segments
# first); then the queue is watched until it is empty. Prints the answers,
# how many the workers had applied when the flood ended, how long the
# queue took to empty after it, and each thread group's CPU over the flood
# (from /proc/PID/task/*/stat: `tokio-rt-worker` the main runtime,
# `bw-apply` the workers' runtime beside an ingress, `queue-writer` the
# log's writer). The issue 23 "Ingress first" figures came from it.
#
#   scripts/bench-flood.sh                        # role all, as configured
#   BREAKWATER_WORKERS_NICE=0 scripts/bench-flood.sh   # one runtime
#   ROLE=ingress SECS=10 IDLE=0 scripts/bench-flood.sh
#
# Needs wrk (Debian package `wrk`; installed here if missing), curl and
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${SECS:-8}"
IDLE="${IDLE:-8}"
ROLE="${ROLE:-all}"
PORT="${PORT:-18081}"
ADMIN_PORT="${ADMIN_PORT:-18082}"
BIN="${BIN:-target/release/breakwater}"
WORK="$(mktemp -d /tmp/bw-flood.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
[ -x "$BIN" ] || cargo build --release -q -p breakwater-cli

. scripts/bench-outside/config.sh
write_breakwater_config "$WORK/breakwater.toml" "$PORT" "127.0.0.1:$ADMIN_PORT" "$WORK"

# Each thread group's CPU seconds so far, as "name=seconds ...".
thread_cpu() {
  python3 - "$1" <<'PY'
import collections, os, sys
pid, tick, cpu = sys.argv[1], os.sysconf("SC_CLK_TCK"), collections.Counter()
for t in os.listdir(f"/proc/{pid}/task"):
    try:
        name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        stat = open(f"/proc/{pid}/task/{t}/stat").read()
    except OSError:
        continue  # the thread ended meanwhile
    fields = stat[stat.rfind(")") + 2:].split()
    cpu[name] += (int(fields[11]) + int(fields[12])) / tick
print(" ".join(f"{k}={v:.2f}" for k, v in sorted(cpu.items())))
PY
}

# Visible plus in flight, or the acknowledged total.
stat() {
  curl -s "127.0.0.1:$ADMIN_PORT/queue/stats" | python3 -c \
    "import json,sys; d=json.load(sys.stdin); print(d['visible']+d['in_flight'] if '$1'=='left' else d['acked_total'])"
}

python3 scripts/bench-outside/signed_requests.py "$WORK/req" $((SECS * 120000)) 2 >/dev/null
RUST_LOG=warn "$BIN" serve --config "$WORK/breakwater.toml" --role "$ROLE" 2>"$WORK/serve.err" &
pid=$!
for _ in $(seq 200); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
sleep "$IDLE"
before="$(thread_cpu "$pid")"
out="$(BW_REQUESTS="$WORK/req" wrk -t2 -c32 -d"${SECS}s" -s scripts/bench-outside/requests.lua \
  "http://127.0.0.1:$PORT/webhooks/stripe")"
after="$(thread_cpu "$pid")"
acked="$(stat acked)"
start="$(date +%s.%N)"
if [ "$ROLE" != ingress ]; then
  while [ "$(stat left)" != 0 ]; do sleep 0.2; done
fi
drained="$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")"
kill "$pid"
wait "$pid" 2>/dev/null || true
echo "answers: $(sed -n 's/^statuses: //p' <<<"$out")"
echo "applied when the flood ended: $acked; queue empty ${drained} s after"
echo "thread CPU before: $before"
echo "thread CPU after:  $after"
