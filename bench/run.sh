#!/usr/bin/env bash
# Runs every benchmark and writes docs/BENCHMARKS.md (and docs/bench/*.png).
# The server runs on core 1 (started under taskset), the load generator on
# core 0.
#   QUICK=1 bench/run.sh     shorter runs, for trying the tooling
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
OUT=target/bench-results
mkdir -p "$OUT"
# Results of an earlier run must not stand in for a scenario skipped now.
rm -f "$OUT"/*.json
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then DUR=5; WARM=2; STEP=3; IDLE=2000; REPEAT=1; CRIT="--warm-up-time 1 --measurement-time 2"; else DUR=20; WARM=5; STEP=5; IDLE=19900; REPEAT=3; CRIT="--warm-up-time 2 --measurement-time 5"; fi
ORIGIN=http://localhost:5180

cargo build --release -p hostwire -p hostwire-bench
BIN=target/release

# The peers' packages (Zod, and Bun for the Bun forwarder) come from npm.
SERVERS="hostwire forwarder"
NODE=0
if command -v node >/dev/null; then
  NODE=1
  (cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
  if bench/peers/node_modules/.bin/bun --version >/dev/null 2>&1; then
    SERVERS="$SERVERS bun"
  else
    echo "bun did not install: the Bun forwarder is skipped" >&2
  fi
else
  echo "node not found: the Zod baseline and the Bun forwarder are skipped" >&2
fi
# The Zod baseline runs before, between and after the criterion benches, so
# that its median sees the machine as they did.
zod() {
  [ "$NODE" = 1 ] || return 0
  echo "== Zod baseline, run $1"
  (cd bench/peers && SECONDS_PER_FIXTURE=3 node zod-hostcalls.mjs) > "$OUT/zod-hostcalls-$1.json"
}
zod 1
if [ "${SKIP_CRITERION:-0}" != 1 ]; then
  echo "== criterion"
  cargo bench -p hostwire-memizy --bench memizy -- $CRIT
  zod 2
  cargo bench -p hostwire-worker-rpc --bench worker_rpc -- $CRIT
else
  zod 2
fi
zod 3

echo "== kernel floor"
FLOOR_S=5; [ "$QUICK" = 1 ] && FLOOR_S=2
for mode in send uring; do
  "$BIN/hostwire-bench" floor --mode $mode --duration-s $FLOOR_S --pin 0,1 --json "$OUT/floor-$mode-paced.json"
  "$BIN/hostwire-bench" floor --mode $mode --rate 0 --duration-s $FLOOR_S --pin 0,1 --json "$OUT/floor-$mode-flat.json"
done

PORT=${PORT:-18787}
if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
  echo "port $PORT is in use: stop what listens there or set PORT" >&2; exit 1
fi
alive() { kill -0 "$SERVER" 2>/dev/null || { echo "the server exited: $(tail -3 "$OUT/server.log")" >&2; exit 1; }; }
start_hostwire() {
  local dir; dir=$(mktemp -d)
  # Started on core 1 so the runtime sizes itself for one core.
  ROOMS_PER_IP_PER_HOUR=100000000 RUST_LOG=warn taskset -c 1 "$BIN/hostwire" serve --port $PORT --data-dir "$dir" --allowed-origins "$ORIGIN" > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do alive; curl -sf "http://127.0.0.1:$PORT/api/health" >/dev/null && return; sleep 0.1; done
  echo "the server did not start" >&2; exit 1
}
start_forwarder() {
  taskset -c 1 "$BIN/hostwire-bench" forwarder --listen 127.0.0.1:$PORT > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do alive; (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return; sleep 0.1; done
  echo "the forwarder did not start" >&2; exit 1
}
start_bun() {
  taskset -c 1 bench/peers/node_modules/.bin/bun bench/peers/bun-forwarder.mjs --listen 127.0.0.1:$PORT > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do alive; (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return; sleep 0.1; done
  echo "the Bun forwarder did not start" >&2; exit 1
}
stop_server() {
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  # The port must be free before the next server starts.
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null || return 0; sleep 0.1; done
}
gen() { "$BIN/hostwire-bench" "$@" --url "http://127.0.0.1:$PORT" --origin "$ORIGIN" --server-pid "$SERVER" --pin 0,1 --quiet; }

# The machine is noisy: each server runs the classroom REPEAT times, the
# servers taking turns, and the report compares paired runs.
for i in $(seq $REPEAT); do
  for who in $SERVERS; do
    echo "== classroom, $who, run $i of $REPEAT"
    start_$who; gen classroom --warmup-s $WARM --duration-s $DUR --json "$OUT/classroom-$who-$i.json"; stop_server
  done
done
for who in $SERVERS; do
  echo "== max, $who"
  start_$who; gen max --warmup-s 2 --duration-s $STEP --json "$OUT/max-$who.json"; stop_server
done
for who in $SERVERS; do
  echo "== idle, $who"
  start_$who; gen idle --connections $IDLE --hold-s 5 --json "$OUT/idle-$who.json"; stop_server
done
echo "== flood, hostwire"
start_hostwire; gen flood --rooms 10 --players 20 --warmup-s $WARM --duration-s $DUR --json "$OUT/flood-hostwire.json"; stop_server

# ggui live channel: actions acked and envelopes fanned out to 100
# subscribers over sockets, each against a bare WebSocket server on the same
# stack (taking turns), and the sans-IO criterion benches.
echo "== ggui"
GGUI_N="20000 2000"; [ "$QUICK" = 1 ] && GGUI_N="5000 500"
cargo bench -p hostwire-ggui --bench ggui -- $CRIT
cargo bench -p hostwire-bench --bench ggui_live -- $GGUI_N --repeat $REPEAT --json "$PWD/$OUT/ggui-live.json"

"$BIN/hostwire-bench" report --results "$OUT" --out docs/BENCHMARKS.md --plots docs/bench --command "bench/run.sh"
