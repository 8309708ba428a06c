#!/usr/bin/env bash
# Issue 23's ingress figure, measured from outside the process: wrk sends
# unique, Stripe-signed 1 KiB webhooks over 32 connections to three servers
# in turn, each in a process of its own, fresh for every phase:
#
#   bare        hyper answering 200 to anything (what the loopback, the
#               client and HTTP cost)
#   lean        the lean floor: the Stripe signature checked, the body
#               appended and fdatasync'ed once per group before the answer,
#               nothing else (examples/floor_server.rs)
#   append      (only with APPEND=1) the lean floor appending
#               to a file that grows instead of a ring
#   breakwater  `breakwater serve --role ingress` on the default segment
#               log (ROLE=all also runs the workers, applying to SQLite)
#
# and prints each phase's accepted webhooks/s, then the median over the
# rounds of breakwater / lean. Rounds rotate which server goes first.
#
#   scripts/bench-outside.sh                  # 3 rounds of 8 s phases
#   ROUNDS=5 SECS=10 CONNS=32 scripts/bench-outside.sh
#   BIN=/tmp/breakwater-before scripts/bench-outside.sh   # another build
#   APPEND=1 scripts/bench-outside.sh         # also the appending floor
#
# Needs wrk (Debian package `wrk`; installed here if missing) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
SECS="${SECS:-8}"
CONNS="${CONNS:-32}"
ROLE="${ROLE:-ingress}"
PORT="${PORT:-18080}"
WORK="$(mktemp -d /tmp/bw-outside.XXXXXX)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
cargo build --release -q -p breakwater-cli
cargo build --release -q -p breakwater-lab --example floor_server
BIN="${BIN:-target/release/breakwater}"
FLOOR=target/release/examples/floor_server

. scripts/bench-outside/config.sh
write_breakwater_config "$WORK/breakwater.toml" "$PORT" "127.0.0.1:0" "$WORK"

# Waits until `port` takes connections (at most 10 s).
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}

# Runs one phase: starts server `$1`, drives it with wrk, stops it; prints
# "name rate accepted-rate statuses p50 p99".
phase() {
  local name="$1" port pid out
  rm -rf "$WORK/queue" "$WORK/sink.db"* "$WORK/lean.log"
  case "$name" in
    bare | lean | append)
      "$FLOOR" "$name" "$WORK/lean.log" >"$WORK/floor.out" &
      pid=$!
      for _ in $(seq 100); do grep -q listening "$WORK/floor.out" && break; sleep 0.1; done
      port="$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$WORK/floor.out")"
      ;;
    breakwater)
      RUST_LOG=warn "$BIN" serve --config "$WORK/breakwater.toml" --role "$ROLE" 2>"$WORK/serve.err" &
      pid=$!
      port="$PORT"
      ;;
  esac
  wait_port "$port"
  out="$(BW_REQUESTS="$WORK/req" wrk -t2 -c"$CONNS" -d"${SECS}s" -s scripts/bench-outside/requests.lua \
    "http://127.0.0.1:$port/webhooks/stripe")"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local rate statuses ok wrapped lat
  rate="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
  statuses="$(sed -n 's/^statuses: //p' <<<"$out")"
  wrapped="$(sed -n 's/^wrapped: //p' <<<"$out")"
  lat="$(sed -n 's/^p50_ms: //p' <<<"$out")"
  # Accepted: 202 for lean and breakwater, 200 for bare hyper.
  ok="$(tr ' ' '\n' <<<"$statuses" | awk -F= -v secs="$SECS" \
    '$1 == 200 || $1 == 202 {n += $2} END {printf "%.0f", n / secs}')"
  printf '%-10s %9s req/s  %7s ok/s  [%s] wrapped=%s p50_ms=%s\n' \
    "$name" "$rate" "$ok" "$statuses" "$wrapped" "$lat" >&2
  echo "$ok"
}

declare -a ratios=() lean_bare=() appends=()
order=(bare lean breakwater)
[ "${APPEND:-0}" = 1 ] && order+=(append)
n=${#order[@]}
for round in $(seq "$ROUNDS"); do
  # Fresh ids and a fresh timestamp every round (Stripe's 300 s window).
  python3 scripts/bench-outside/signed_requests.py "$WORK/req" $((SECS * 120000)) 2
  echo "round $round" >&2
  declare -A got=()
  for k in $(seq 0 $((n - 1))); do
    name="${order[$(((k + round - 1) % n))]}"
    got[$name]="$(phase "$name")"
  done
  percent() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", 100 * a / b}'; }
  ratios+=("$(percent "${got[breakwater]}" "${got[lean]}")")
  lean_bare+=("$(percent "${got[lean]}" "${got[bare]}")")
  echo "  breakwater / lean ${ratios[-1]}%, lean / bare ${lean_bare[-1]}%" >&2
  if [ -n "${got[append]:-}" ]; then
    appends+=("$(percent "${got[breakwater]}" "${got[append]}")")
    echo "  breakwater / append ${appends[-1]}%" >&2
  fi
  unset got
done
median() { tr ' ' '\n' <<<"$*" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
echo "ratio breakwater / lean floor (median of rounds): $(median "${ratios[@]}")% (${ratios[*]})"
echo "ratio lean floor / bare hyper (median of rounds): $(median "${lean_bare[@]}")% (${lean_bare[*]})"
if [ "${#appends[@]}" -gt 0 ]; then
  echo "ratio breakwater / appending floor (median of rounds): $(median "${appends[@]}")% (${appends[*]})"
fi
