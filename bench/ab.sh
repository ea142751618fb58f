#!/usr/bin/env bash
# Two builds of `hostwire serve` taking turns on one workload, for a lever
# measured as a ratio in one run (the machine is shared and noisy).
#   bench/ab.sh BIN_A BIN_B ROUNDS -- <hostwire-bench arguments>
# e.g. bench/ab.sh /tmp/a/hostwire target/release/hostwire 3 -- sessions --sessions 100 --controllers 30 --rates 1,5
# Each round starts A then B afresh (a new data directory each), the server
# on core 1 and the generator (target/release/hostwire-bench) on core 0, and
# writes $OUT/ab-{a,b}-ROUND.json.
# The servers log at warn; SERVER_LOG sets another level (e.g. info, serve's
# default).
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1; B=$2; ROUNDS=$3; shift 3; [ "${1:-}" = -- ] && shift
OUT=${OUT:-target/bench-results}; mkdir -p "$OUT"
PORT=${PORT:-18787}
ORIGIN=http://localhost:5180
export HOSTWIRE_OPERATOR_TOKEN=${HOSTWIRE_OPERATOR_TOKEN:-bench-operator-$(date +%s)-$$-credential}
SERVER=""
# Every round's data directory is made in WORK, removed at exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hostwire-ab.XXXXXX")
trap '[ -n "$SERVER" ] && { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }; rm -rf "$WORK"; true' EXIT
start() {
  local dir; dir=$(mktemp -d "$WORK/data.XXXX")
  HOSTWIRE_OPERATOR_TOKEN="$HOSTWIRE_OPERATOR_TOKEN" MATCHES_PER_IP_PER_HOUR=100000000 GGUI_SESSIONS_PER_IP_PER_HOUR=100000000 ROOMS_PER_IP_PER_HOUR=100000000 JOINS_PER_IP_PER_SECOND=0 LOOKUPS_PER_IP_PER_SECOND=0 CONNECTIONS_PER_IP=100000 RUST_LOG=${SERVER_LOG:-warn} taskset -c 1 "$1" serve --port "$PORT" --data-dir "$dir" --allowed-origins "$ORIGIN" > "$OUT/ab-server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/api/health" >/dev/null && return; sleep 0.1; done
  echo "the server did not start: $(tail -3 "$OUT/ab-server.log")" >&2; exit 1
}
stop() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; }
for r in $(seq "$ROUNDS"); do
  for side in a b; do
    bin=$A; [ $side = b ] && bin=$B
    echo "== round $r, $side ($bin)"
    start "$bin"
    target/release/hostwire-bench "$@" --url "http://127.0.0.1:$PORT" --origin "$ORIGIN" --server-pid "$SERVER" --pin 0,1 --json "$OUT/ab-$side-$r.json"
    stop
  done
done
