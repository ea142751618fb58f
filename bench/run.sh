#!/usr/bin/env bash
# Runs every benchmark and writes docs/BENCHMARKS.md (and docs/bench/*.png).
# The server runs on core 1 (started under taskset), the load generator on
# core 0.
#   QUICK=1 bench/run.sh     shorter runs, for trying the tooling
#   REFERENCE_RELAY=DIR      also run the reference Memizy relay (DIR is its
#                            services/multiplayer-server, set up as
#                            bench/README.md says) in the classroom, max and
#                            idle rounds
#   RELAY_ONLY=1             only the kernel floor and the classroom, max and
#                            idle rounds (no criterion, peers or other
#                            scenarios), then the report
#   CLUSTER=1                also one node against three on PostgreSQL and
#                            NATS (bench/cluster.sh)
set -euo pipefail
# The operator's path, before the working directory changes.
REFERENCE_RELAY=${REFERENCE_RELAY:+$(cd "$REFERENCE_RELAY" && pwd)}
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
OUT=target/bench-results
mkdir -p "$OUT"
# Results of an earlier run must not stand in for a scenario skipped now.
rm -f "$OUT"/*.json
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then DUR=5; WARM=2; STEP=3; IDLE=2000; REPEAT=1; CRIT="--warm-up-time 1 --measurement-time 2"; else DUR=20; WARM=5; STEP=5; IDLE=19900; REPEAT=3; CRIT="--warm-up-time 2 --measurement-time 5"; fi
RELAY_ONLY=${RELAY_ONLY:-0}
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
# The reference relay is not ours to vendor: it runs from the operator's copy,
# on the Bun the peers installed.
BUN="$PWD/bench/peers/node_modules/.bin/bun"
if [ -z "$REFERENCE_RELAY" ]; then
  echo "REFERENCE_RELAY not set: the reference relay is not run; the page compares with the Bun forwarder (bench/README.md says how to set it up)" >&2
elif [ ! -f "$REFERENCE_RELAY/src/main.ts" ]; then
  echo "REFERENCE_RELAY=$REFERENCE_RELAY has no src/main.ts: give the reference's services/multiplayer-server" >&2; exit 1
elif ! "$BUN" --version >/dev/null 2>&1; then
  echo "bun is not installed (it comes from npm in bench/peers): the reference relay is skipped" >&2
elif ! command -v jq >/dev/null; then
  echo "jq not found (it joins the reference's max steps): the reference relay is skipped" >&2
else
  SERVERS="$SERVERS reference"
  echo "{\"bun\": \"$("$BUN" --version)\", \"path\": \"$REFERENCE_RELAY\"}" > "$OUT/reference-relay.json"
fi
# The Zod baseline runs before, between and after the criterion benches, so
# that its median sees the machine as they did.
zod() {
  [ "$NODE" = 1 ] || return 0
  echo "== Zod baseline, run $1"
  (cd bench/peers && SECONDS_PER_FIXTURE=3 node zod-hostcalls.mjs) > "$OUT/zod-hostcalls-$1.json"
}
if [ "$RELAY_ONLY" != 1 ]; then
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
fi

echo "== kernel floor"
FLOOR_S=5; [ "$QUICK" = 1 ] && FLOOR_S=2
for mode in send uring; do
  "$BIN/hostwire-bench" floor --mode $mode --duration-s $FLOOR_S --pin 0,1 --json "$OUT/floor-$mode-paced.json"
  "$BIN/hostwire-bench" floor --mode $mode --rate 0 --duration-s $FLOOR_S --pin 0,1 --json "$OUT/floor-$mode-flat.json"
done

PORT=${PORT:-18787}
# Creating matches and hosted sessions needs the operator credential: one
# for this run, given to the server and to the load generators alike.
export HOSTWIRE_OPERATOR_TOKEN=${HOSTWIRE_OPERATOR_TOKEN:-bench-operator-$(date +%s)-$$-credential}
if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then
  echo "port $PORT is in use: stop what listens there or set PORT" >&2; exit 1
fi
# Every server's data directory is made in WORK, removed at exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hostwire-run.XXXXXX")
alive() { kill -0 "$SERVER" 2>/dev/null || { echo "the server exited: $(tail -3 "$OUT/server.log")" >&2; exit 1; }; }
start_hostwire() {
  local dir; dir=$(mktemp -d "$WORK/data.XXXX")
  # Started on core 1 so the runtime sizes itself for one core. Every
  # client is 127.0.0.1: the per-IP limits are off.
  HOSTWIRE_OPERATOR_TOKEN="$HOSTWIRE_OPERATOR_TOKEN" MATCHES_PER_IP_PER_HOUR=100000000 GGUI_SESSIONS_PER_IP_PER_HOUR=100000000 ROOMS_PER_IP_PER_HOUR=100000000 JOINS_PER_IP_PER_SECOND=0 LOOKUPS_PER_IP_PER_SECOND=0 CONNECTIONS_PER_IP=100000 RUST_LOG=warn taskset -c 1 "$BIN/hostwire" serve --port $PORT --data-dir "$dir" --allowed-origins "$ORIGIN" > "$OUT/server.log" 2>&1 &
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
start_reference() {
  # From its own directory, as its start script runs it; exec keeps the
  # PID the generator reads /proc of.
  (cd "$REFERENCE_RELAY" && PORT=$PORT HOST=127.0.0.1 ALLOWED_ORIGINS="$ORIGIN" exec taskset -c 1 "$BUN" src/main.ts) > "$OUT/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 50); do alive; curl -sf "http://127.0.0.1:$PORT/api/health" >/dev/null && return; sleep 0.1; done
  echo "the reference relay did not start" >&2; exit 1
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
# A run that stops early (a failed step under `set -e`) leaves no server
# behind on the port for the next run.
trap '[ -n "${SERVER:-}" ] && stop_server; rm -rf "$WORK"' EXIT
gen() { "$BIN/hostwire-bench" "$@" --url "http://127.0.0.1:$PORT" --origin "$ORIGIN" --server-pid "$SERVER" --pin 0,1 --quiet; }

# The machine is noisy: each server runs the classroom REPEAT times, the
# servers taking turns, and the report compares paired runs.
for i in $(seq $REPEAT); do
  for who in $SERVERS; do
    echo "== classroom, $who, run $i of $REPEAT"
    start_$who; gen classroom --warmup-s $WARM --duration-s $DUR --json "$OUT/classroom-$who-$i.json"; stop_server
  done
done
# The reference lets one address create 60 rooms an hour (every client here
# is 127.0.0.1): it starts afresh for each classroom run (50 rooms) and each
# max step, whose steps stop at 60 rooms, and holds at most 6,000 idle
# connections (rooms of 100).
REF_ROOMS=60
REF_MAX_STEPS=${REF_MAX_STEPS:-10 20 30 40 50 60}
for who in $SERVERS; do
  echo "== max, $who"
  if [ "$who" = reference ]; then
    for n in $REF_MAX_STEPS; do
      [ "$n" -le $REF_ROOMS ] || { echo "max step of $n rooms skipped: above the reference's $REF_ROOMS rooms an hour" >&2; continue; }
      start_$who; gen max --steps "$n" --warmup-s 2 --duration-s $STEP --json "$OUT/max-$who-step-$n.json"; stop_server
      [ "$(jq -r .stop_reason "$OUT/max-$who-step-$n.json")" = "every step passed" ] || break
    done
    # One result of the same shape as the others': every step, the last
    # that passed, and why the steps stopped.
    jq -s --arg cap "the reference's limit of $REF_ROOMS rooms an hour from one address ended the steps" \
      '{scenario: "max", steps: map(.steps[]), last_good: (map(.last_good | select(. != null)) | last),
        stop_reason: (map(.stop_reason) | map(select(. != "every step passed")) | first // $cap)}' \
      $(ls -v "$OUT"/max-$who-step-*.json) > "$OUT/max-$who.json"
    rm -f "$OUT"/max-$who-step-*.json
  else
    start_$who; gen max --warmup-s 2 --duration-s $STEP --json "$OUT/max-$who.json"; stop_server
  fi
done
for who in $SERVERS; do
  echo "== idle, $who"
  n=$IDLE; [ "$who" = reference ] && [ "$n" -gt $((REF_ROOMS * 100)) ] && n=$((REF_ROOMS * 100))
  start_$who; gen idle --connections $n --hold-s 5 --json "$OUT/idle-$who.json"; stop_server
done
if [ "$RELAY_ONLY" != 1 ]; then
echo "== flood, hostwire"
start_hostwire; gen flood --rooms 10 --players 20 --warmup-s $WARM --duration-s $DUR --json "$OUT/flood-hostwire.json"; stop_server

# Hosted Memizy sessions (SPEC 3-8 run by the server): 100 sessions of a
# board and 30 controllers played by the headless device client, each
# controller sending to the authority and the board to each controller at
# each rate of SESS_RATES per instance (30/s is SPEC 8.1's guaranteed rate;
# the lower steps show where the server's core saturates). The relay's
# classroom runs on a fresh server right before and after it: the report
# gives CPU per routed call as a ratio to its CPU per forwarded frame.
SESS_RATES=${SESS_RATES:-1,2,5,10,20,30}
echo "== sessions: relay baseline before"
start_hostwire; gen classroom --warmup-s $WARM --duration-s $DUR --json "$OUT/sessions-baseline-1.json"; stop_server
echo "== sessions, hostwire, rates $SESS_RATES"
start_hostwire; gen sessions --sessions 100 --controllers 30 --rates "$SESS_RATES" --warmup-s $WARM --duration-s $DUR --json "$OUT/sessions-hostwire.json"; stop_server
echo "== sessions: relay baseline after"
start_hostwire; gen classroom --warmup-s $WARM --duration-s $DUR --json "$OUT/sessions-baseline-2.json"; stop_server
# Churn: players rename while they play; each rename is a change the room
# acknowledges only once it is stored. Forwarding in those rooms and in
# quiet ones, and the renames themselves, measured in one run.
echo "== churn, hostwire"
start_hostwire; gen churn --warmup-s $WARM --duration-s $DUR --json "$OUT/churn-hostwire.json"; stop_server
# --- PlayerThree JSON delta: hostwire's criterion bench `delta` and the
# JavaScript libraries (jsondiffpatch, fast-json-patch, mutative) on the same
# fixture pair (bench/fixtures/delta), back to back in this run; the report
# compares their CPU time per diff+apply as ratios (bench/src/report_delta.rs).
if [ "${SKIP_CRITERION:-0}" != 1 ]; then
  echo "== delta, criterion"
  cargo bench -p hostwire-core --bench delta -- $CRIT
fi
if [ "$NODE" = 1 ]; then
  echo "== delta, JavaScript libraries"
  DELTA_S=3; [ "$QUICK" = 1 ] && DELTA_S=1
  (cd bench/peers && SECONDS_PER_LIB=$DELTA_S node delta-libs.mjs) > "$OUT/delta-libs.json"
fi
# --- end of the PlayerThree JSON delta

# --- PlayerThree match: one view update fanned out to 1,000 spectators, then
# delayed frames released to 1,000 observers, against hostwire serve with
# 250 ms ticks (a Ridge match lasts 60 ticks); the relay classroom above is
# the baseline (bench/src/report_match.rs).
echo "== match, hostwire"
MATCH_WARM=2; MATCH_DUR=10; [ "$QUICK" = 1 ] && { MATCH_WARM=1; MATCH_DUR=4; }
PLAYERTHREE_TICK_MS=250 CONNECTIONS_PER_IP=100000 start_hostwire
gen match --spectators 1000 --observers 1000 --delay-ms 1000 --tick-ms 250 --warmup-s $MATCH_WARM --duration-s $MATCH_DUR --json "$OUT/match-hostwire.json"
stop_server
# --- end of the PlayerThree match
# ggui live channel: actions acked and envelopes fanned out to 100
# subscribers over sockets, each against a bare WebSocket server on the same
# stack (taking turns), and the sans-IO criterion benches.
echo "== ggui"
GGUI_N="20000 2000"; [ "$QUICK" = 1 ] && GGUI_N="5000 500"
cargo bench -p hostwire-ggui --bench ggui -- $CRIT
cargo bench -p hostwire-store --bench ggui_apply -- $CRIT
cargo bench -p hostwire-bench --bench ggui_live -- $GGUI_N --repeat $REPEAT --json "$PWD/$OUT/ggui-live.json"
fi

if [ "${CLUSTER:-0}" = 1 ]; then
  OUT="$OUT" QUICK="$QUICK" CLUSTER_BUILD=0 bench/cluster.sh
fi

"$BIN/hostwire-bench" report --results "$OUT" --out docs/BENCHMARKS.md --plots docs/bench --command "bench/run.sh"
