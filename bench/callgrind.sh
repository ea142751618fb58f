#!/usr/bin/env bash
# Instructions per unit of work, counted by callgrind (not by a clock, so
# a noisy machine does not move them): `hostwire serve` under callgrind
# with instrumentation off, the workload started, instrumentation on for a
# window, and the window's instructions divided by the change of one
# counter of /metrics over it.
#   bench/callgrind.sh BIN OUT_PREFIX METRIC -- <hostwire-bench arguments>
# e.g. CG_START=15 CG_LEN=20 bench/callgrind.sh target/release/hostwire /tmp/cg-a \
#        hostwire_memizy_session_host_calls_total -- sessions --sessions 10 \
#        --controllers 10 --rates 1 --warmup-s 2 --duration-s 40
# The window starts CG_START seconds into the workload and lasts CG_LEN
# seconds (keep both inside its duration). Writes OUT_PREFIX.cg.1 (for
# callgrind_annotate), .json and the logs; prints the count per unit.
# Needs valgrind; the generator is target/release/hostwire-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$1; OUTP=$2; METRIC=$3; shift 3; [ "${1:-}" = -- ] && shift
PORT=${PORT:-18799}; ORIGIN=http://localhost:5180
export HOSTWIRE_OPERATOR_TOKEN=${HOSTWIRE_OPERATOR_TOKEN:-bench-operator-$(date +%s)-$$-credential}
dir=$(mktemp -d "${TMPDIR:-/tmp}/hostwire-callgrind.XXXXXX")
counter() {
  curl -s "http://127.0.0.1:$PORT/metrics" |
    awk -v m="$METRIC" '{n=$1; sub(/{.*/,"",n)} n==m {s+=$2} END {print s+0}'
}
MATCHES_PER_IP_PER_HOUR=100000000 GGUI_SESSIONS_PER_IP_PER_HOUR=100000000 ROOMS_PER_IP_PER_HOUR=100000000 JOINS_PER_IP_PER_SECOND=0 LOOKUPS_PER_IP_PER_SECOND=0 CONNECTIONS_PER_IP=100000 RUST_LOG=warn \
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUTP.cg" "$BIN" serve --port "$PORT" --data-dir "$dir" --allowed-origins "$ORIGIN" > "$OUTP.server.log" 2>&1 &
VG=$!
trap 'kill "$VG" 2>/dev/null; wait "$VG" 2>/dev/null; rm -rf "$dir"; true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/api/health" >/dev/null && break; sleep 0.2; done
target/release/hostwire-bench "$@" --url "http://127.0.0.1:$PORT" --origin "$ORIGIN" --server-pid "$VG" --json "$OUTP.json" > "$OUTP.bench.log" 2>&1 &
B=$!
sleep "${CG_START:-15}"
m0=$(counter)
callgrind_control -i on "$VG" >/dev/null 2>&1
sleep "${CG_LEN:-20}"
callgrind_control -i off "$VG" >/dev/null 2>&1
m1=$(counter)
wait "$B"
callgrind_control -d "$VG" >/dev/null 2>&1
sleep 2
kill "$VG"; wait "$VG" 2>/dev/null || true
ir=$(callgrind_annotate "$OUTP.cg.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
echo "$METRIC +$((m1 - m0)) in the window; $ir instructions; $((ir / (m1 - m0 > 0 ? m1 - m0 : 1))) per unit"
