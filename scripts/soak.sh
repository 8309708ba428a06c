#!/usr/bin/env bash
# The soak (not in CI): the release binary on the embedded queue and a
# scratch database of the machine's PostgreSQL, under a steady stream
# (`breakwater bench send`, default 700 webhooks/s: 30% of the ~2,300
# applies/s `bench drain` measured here), a fault every few minutes in
# turn (a hot row locked 20 s, the sink's sessions terminated, the orders
# table locked 10 s, a manual trip of 15 s), and every minute a sample of
# the process's memory and file descriptors, the queue's files, the queue
# depth and what was applied. At the end: the samples, and every accepted
# webhook applied (the inbox counts them).
#
#   scripts/soak.sh                       # 60 minutes
#   SOAK_MINUTES=30 SOAK_RATE=500 scripts/soak.sh
#   SOAK_FAULT_EVERY=300                  # seconds between faults
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=${SOAK_MINUTES:-60}
RATE=${SOAK_RATE:-700}
FAULT_EVERY=${SOAK_FAULT_EVERY:-300}
PG=${SOAK_PG:-postgres://postgres@127.0.0.1:5432}
say() { printf '==> %s\n' "$*" >&2; }

cargo build --release -p breakwater-cli >&2
BIN=$PWD/target/release/breakwater
DIR=$(mktemp -d /tmp/bw-soak-XXXXXX)
DB=bw_soak_$$
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
INGRESS=$(free_port); ADMIN=$(free_port)
SECRET=whsec_soak_secret

psql "$PG/postgres" -qc "CREATE DATABASE $DB" >/dev/null
cleanup() {
  [[ -n "${SEND:-}" ]] && kill "$SEND" 2>/dev/null || true
  [[ -n "${SERVE:-}" ]] && kill "$SERVE" 2>/dev/null && wait "$SERVE" 2>/dev/null || true
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
psql "$PG/$DB" -q >/dev/null <<'SQL'
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL,
                     applied_count int NOT NULL DEFAULT 0, updated_at timestamptz);
INSERT INTO orders (id, status) SELECT g, 'new' FROM generate_series(1, 1042) g;
SQL

cat > "$DIR/breakwater.toml" <<EOF
[ingress]
listen = "127.0.0.1:$INGRESS"
[admin]
listen = "127.0.0.1:$ADMIN"
[queue]
path = "$DIR/queue"
# Short, so the soak reaches the steady state of pruning.
dedup_window_secs = 300
[sink]
url = "$PG/$DB"
[[source]]
name = "stripe"
scheme = "stripe"
secrets = ["$SECRET"]
entity_key = "json:/data/object/id"
[[source.statement]]
sql = "UPDATE orders SET status = \$status, applied_count = applied_count + 1, updated_at = now() WHERE id = \$entity"
params = { status = "json:/data/object/status" }
EOF

"$BIN" serve --config "$DIR/breakwater.toml" 2>"$DIR/serve.log" &
SERVE=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null || { cat "$DIR/serve.log" >&2; exit 1; }
say "soak: $MINUTES min at $RATE/s, a fault every $FAULT_EVERY s (pid $SERVE, data $DIR)"

BREAKWATER_SEND_SECRET="$SECRET" "$BIN" bench send --url "http://127.0.0.1:$INGRESS/webhooks/stripe" \
  --rate "$RATE" --duration $((MINUTES * 60)) --hot-share 0.02 --tag "soak$$" \
  >"$DIR/send.out" 2>"$DIR/send.log" &
SEND=$!

sample() {
  local rss fds qbytes wal stats visible inflight applied state
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$SERVE/status")
  fds=$(ls "/proc/$SERVE/fd" | wc -l)
  qbytes=$(du -sb "$DIR/queue" | cut -f1)
  wal=$(cat "$DIR"/queue/*-wal 2>/dev/null | wc -c)
  stats=$(curl -sf "http://127.0.0.1:$ADMIN/queue/stats" || echo '{}')
  visible=$(jq -r '.visible // "?"' <<<"$stats")
  inflight=$(jq -r '.in_flight // "?"' <<<"$stats")
  applied=$(psql "$PG/$DB" -tAc "SELECT count(*) FROM breakwater_inbox")
  state=$(curl -sf "http://127.0.0.1:$ADMIN/breaker" | jq -r '.breaker.state // "?"')
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$((rss / 1024))" "$fds" \
    "$((qbytes / 1024))" "$((wal / 1024))" "$visible" "$inflight" "$applied" "$state"
}

fault() {
  case $(( $1 % 4 )) in
    0) say "fault: order 1042 locked for 20 s"
       psql "$PG/$DB" -qc "BEGIN; SELECT 1 FROM orders WHERE id = 1042 FOR UPDATE; SELECT pg_sleep(20); COMMIT" >/dev/null & ;;
    1) say "fault: the sink's sessions terminated"
       psql "$PG/$DB" -qtAc "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '$DB' AND pid <> pg_backend_pid()" >/dev/null ;;
    2) say "fault: the orders table locked for 10 s"
       psql "$PG/$DB" -qc "BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(10); COMMIT" >/dev/null & ;;
    3) say "fault: a manual trip for 15 s"
       curl -sf -XPOST -H 'Content-Type: application/json' "http://127.0.0.1:$ADMIN/breaker/trip?ttl_secs=15&note=soak" >/dev/null ;;
  esac
}

SAMPLES="$DIR/samples"
echo "| minute | RSS MiB | fds | queue KiB | WAL KiB | visible | in flight | applied | breaker |" >"$SAMPLES"
echo "|---|---|---|---|---|---|---|---|---|" >>"$SAMPLES"
start=$(date +%s); next_fault=$((start + FAULT_EVERY)); faults=0; minute=0
while kill -0 "$SEND" 2>/dev/null; do
  sleep 5
  now=$(date +%s)
  if (( now >= next_fault )); then fault "$faults"; faults=$((faults + 1)); next_fault=$((now + FAULT_EVERY)); fi
  if (( now - start >= (minute + 1) * 60 )); then minute=$((minute + 1)); sample "$minute" | tee -a "$SAMPLES" >&2; fi
done
wait "$SEND" || true
SEND=
read -r sent accepted refused < <(tail -n 1 "$DIR/send.out" | sed 's/sent \([0-9]*\), accepted \([0-9]*\), refused \([0-9]*\)/\1 \2 \3/')
say "sent $sent, accepted $accepted, refused $refused; draining"
for _ in $(seq 1 120); do
  applied=$(psql "$PG/$DB" -tAc "SELECT count(*) FROM breakwater_inbox")
  (( applied >= accepted )) && break
  sleep 1
done
sample "end" >>"$SAMPLES"
dead=$(curl -sf "http://127.0.0.1:$ADMIN/queue/stats" | jq -r '.dead_lettered // 0')
cat "$SAMPLES"
echo
echo "sent $sent, accepted $accepted, applied $applied, dead-lettered $dead, faults $faults"
if (( applied + dead < accepted )); then
  echo "LOST: $((accepted - applied - dead)) accepted webhooks neither applied nor dead-lettered"
  exit 1
fi
