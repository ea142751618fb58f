#!/usr/bin/env bash
# The cluster benchmark (issue 24): one node against three on PostgreSQL
# and NATS, in one run. Starts a private PostgreSQL (initdb in a temporary
# directory, a loopback port) and a nats-server (a loopback port), both
# stopped at exit, as is every node, however the script ends.
#   - classroom on one node (--postgres-url alone), then on three (hosts on
#     A, players on B and C): CPU per delivered frame summed over the nodes
#     (nats-server's apart), p50 / p99;
#   - failover: A killed with SIGKILL mid-game, clients rejoin on B or C;
#   - idle connections on one node and on three.
# Every hostwire serve and nats-server on core 1, the generator on core 0.
# Writes $OUT/cluster-*.json and $OUT/cluster.md (the page's section).
#   QUICK=1          shorter runs
#   LEASE_TTL=2s     the nodes' --lease-ttl (the failover target is it + 1 s)
#   CLUSTER_PORT     the first of the nodes' ports (default 18790)
#   CLUSTER_LOG      the nodes' RUST_LOG (default warn; logs in $OUT/cluster-DB-node-N.log)
#   CLUSTER_PERF=1   perf record (CLUSTER_PERF_ARGS, default -g) of the three nodes for 4 s of each
#                    three-node classroom ($OUT/cluster-perf-N.data)
#   CLUSTER_SWITCHES=1  perf stat of the nodes' context switches for 4 s of each classroom
#                    ($OUT/cluster-switches-{one,three}-N.txt)
#   CLUSTER_ONLY=classroom   the classroom runs alone (no failover, no idle)
#   CLUSTER_ONLY=leases      only the lease upkeep of LEASE_ROOMS idle rooms (default 500) on one node
#   CLUSTER_BIN=DIR          the hostwire binaries to run (default target/release)
#   CLUSTER_ROOMS, CLUSTER_PLAYERS  the classroom's rooms (default 10) and players a room (default 20)
# Called by bench/run.sh with CLUSTER=1 (after its build), or alone.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
OUT=${OUT:-target/bench-results}
mkdir -p "$OUT"
rm -f "$OUT"/cluster-*.json "$OUT"/cluster-*.log "$OUT"/cluster-*.batches
QUICK=${QUICK:-0}
LEASE_TTL=${LEASE_TTL:-2s}
# 10 rooms of 20 players offer 5,000 frames a second: below what one core
# carries through three nodes, so that CPU per frame is not a queue's.
# CLUSTER_ROOMS and CLUSTER_PLAYERS set another load.
ROOMS=${CLUSTER_ROOMS:-10}; PLAYERS=${CLUSTER_PLAYERS:-20}
# The machine is shared and noisy: the classroom runs REPEAT times, one node
# then three, and the page gives the median of the paired ratios.
if [ "$QUICK" = 1 ]; then DUR=5; WARM=2; IDLE=900; REPEAT=1; else DUR=20; WARM=5; IDLE=3000; REPEAT=3; fi
REPEAT=${CLUSTER_REPEAT:-$REPEAT}
ORIGIN=http://localhost:5180
BIN=${CLUSTER_BIN:-target/release}
if [ "${CLUSTER_BUILD:-1}" = 1 ]; then
  cargo build --release -p hostwire -p hostwire-bench
fi

PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$PG_BIN" ] || PG_BIN=$(dirname "$(command -v initdb)")
[ -x "$PG_BIN/initdb" ] || { echo "no PostgreSQL server binaries (Debian's postgresql package)" >&2; exit 1; }
NATS_BIN=$(command -v nats-server || echo /usr/sbin/nats-server)
[ -x "$NATS_BIN" ] || { echo "no nats-server (Debian's nats-server package)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hostwire-cluster-bench.XXXXXX")
chmod 755 "$WORK"
NODES=()
NATS_PID=
PG_UP=0
# PostgreSQL refuses root: its files and process belong to `postgres`.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  local p
  for p in "${NODES[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -n "$NATS_PID" ] && { kill "$NATS_PID" 2>/dev/null || true; wait "$NATS_PID" 2>/dev/null || true; }
  [ "$PG_UP" = 1 ] && as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
# A signal ends the script through the same cleanup.
trap 'exit 130' INT TERM

# A loopback port nobody listens on.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 30000))
    (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
  done
  echo "no free port" >&2; exit 1
}

echo "== cluster: PostgreSQL and nats-server"
PG_PORT=$(free_port)
mkdir "$WORK/pg"; [ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
as_pg "$PG_BIN/initdb" -D "$WORK/pg" -A trust -U hostwire -E UTF8 --no-sync > "$WORK/initdb.log" 2>&1 \
  || { cat "$WORK/initdb.log" >&2; exit 1; }
# Durability is not what is measured: relay frames are never stored, and
# the rooms' joins are the same writes on one node and on three.
as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/log" -w start \
  -o "-k $WORK/pg -h 127.0.0.1 -p $PG_PORT -c fsync=off -c synchronous_commit=off -c max_connections=300" >/dev/null
PG_UP=1
pg_url() { echo "postgresql://hostwire@127.0.0.1:$PG_PORT/$1"; }
new_db() { "$PG_BIN/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U hostwire -d postgres -c "CREATE DATABASE $1" >/dev/null; }
NATS_PORT=$(free_port)
taskset -c 1 "$NATS_BIN" -a 127.0.0.1 -p "$NATS_PORT" > "$OUT/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$NATS_PORT) 2>/dev/null && break; sleep 0.1; done
kill -0 "$NATS_PID" || { echo "nats-server did not start: $(tail -3 "$OUT/nats.log")" >&2; exit 1; }
jq -n --arg date "$(date -u '+%Y-%m-%d %H:%M UTC')" --arg pg "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}')" \
  --arg nats "$("$NATS_BIN" --version | awk '{print $2}')" --arg lease "${LEASE_TTL%s}" \
  --argjson rooms $ROOMS --argjson players $PLAYERS --argjson idle $IDLE --argjson quick "$QUICK" \
  '{date: $date, postgres: $pg, nats: $nats, lease_ttl_s: ($lease | tonumber), rooms: $rooms, players: $players, idle: $idle, quick: ($quick == 1)}' \
  > "$OUT/cluster-setup.json"

BASE_PORT=${CLUSTER_PORT:-18790}
for p in $BASE_PORT $((BASE_PORT + 1)) $((BASE_PORT + 2)); do
  if (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port $p is in use: set CLUSTER_PORT" >&2; exit 1; fi
done
url_of() { echo "http://127.0.0.1:$((BASE_PORT + $1))"; }
# Node number $1 (0 = A) on database $2, with NATS when $3 = nats; its PID
# in NODE. Every client is 127.0.0.1: the per-IP limits are off.
start_node() {
  local n=$1 db=$2 dir; dir=$(mktemp -d "$WORK/node-$n.XXXX")
  local args=(serve --port $((BASE_PORT + n)) --data-dir "$dir" --allowed-origins "$ORIGIN"
    --postgres-url "$(pg_url "$db")" --lease-ttl "$LEASE_TTL" --node-id "node-$n")
  [ "$3" = nats ] && args+=(--nats-url "nats://127.0.0.1:$NATS_PORT")
  ROOMS_PER_IP_PER_HOUR=100000000 JOINS_PER_IP_PER_SECOND=0 LOOKUPS_PER_IP_PER_SECOND=0 CONNECTIONS_PER_IP=100000 \
    RUST_LOG=${CLUSTER_LOG:-warn} taskset -c 1 "$BIN/hostwire" "${args[@]}" > "$OUT/cluster-$db-node-$n.log" 2>&1 &
  NODE=$!
  NODES+=("$NODE")
  for _ in $(seq 100); do
    kill -0 "$NODE" 2>/dev/null || { echo "node $n exited: $(tail -3 "$OUT/cluster-$db-node-$n.log")" >&2; exit 1; }
    curl -sf "$(url_of "$n")/api/health" >/dev/null && return
    sleep 0.1
  done
  echo "node $n did not start" >&2; exit 1
}
# Until each of the three nodes hears the other two (a client is carried
# only to an owner its node has heard of).
until_peers() {
  local n
  for n in 0 1 2; do
    for _ in $(seq 100); do
      [ "$(curl -sf "$(url_of "$n")/api/health" | jq '.peers | length')" = 2 ] && continue 2
      sleep 0.1
    done
    echo "node $n did not hear its peers" >&2; exit 1
  done
}
stop_nodes() {
  local p
  for p in "${NODES[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  NODES=()
}
gen() { "$BIN/hostwire-bench" "$@" --origin "$ORIGIN" --pin 0,1 --quiet; }
# The context switches of the server processes $2 over 4 s of the
# measured window (perf stat, in the background), written to $1.
switches() {
  (sleep $((WARM + 1)); perf stat -x, -e context-switches,task-clock -o "$1" -p "$2" -- sleep 4 >/dev/null 2>&1) &
}
one_node() { new_db "$1"; start_node 0 "$1" none; A=$NODE; }
three_nodes() {
  new_db "$1"
  start_node 0 "$1" nats; A=$NODE
  start_node 1 "$1" nats; B=$NODE
  start_node 2 "$1" nats; C=$NODE
  until_peers
}

# Lease upkeep: LEASE_ROOMS rooms (default 500) created on one node and
# nobody connected; the CPU the node and PostgreSQL (its postmaster and
# every backend) spend in 10 s, which is the renewals' and little else.
if [ "${CLUSTER_ONLY:-}" = leases ]; then
  LEASE_ROOMS=${LEASE_ROOMS:-500}
  echo "== cluster: lease upkeep, $LEASE_ROOMS rooms on one node, leases of $LEASE_TTL"
  one_node bench_leases
  for _ in $(seq "$LEASE_ROOMS"); do
    curl -sf -X POST -H "Origin: $ORIGIN" "$(url_of 0)/api/rooms" >/dev/null || { echo "a room was refused" >&2; exit 1; }
  done
  PG_MAIN=$(head -1 "$WORK/pg/postmaster.pid")
  ticks() { for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }
  pg_ticks() { ticks "$PG_MAIN" $(pgrep -P "$PG_MAIN"); }
  sleep 3
  n0=$(ticks "$A"); p0=$(pg_ticks); renewed0=$(curl -sf "$(url_of 0)/metrics" | awk '/^hostwire_cluster_leases_renewed_total/ {print $2}')
  sleep 10
  n1=$(ticks "$A"); p1=$(pg_ticks); renewed1=$(curl -sf "$(url_of 0)/metrics" | awk '/^hostwire_cluster_leases_renewed_total/ {print $2}')
  lost=$(curl -sf "$(url_of 0)/metrics" | awk '/^hostwire_cluster_leases_lost_total/ {print $2}')
  hz=$(getconf CLK_TCK)
  echo "node CPU $(( (n1 - n0) * 1000 / hz / 10 )) ms a second; PostgreSQL CPU $(( (p1 - p0) * 1000 / hz / 10 )) ms a second; $(( (renewed1 - renewed0) / 10 )) renewals a second; leases lost: $lost"
  exit 0
fi

for i in $(seq $REPEAT); do
  echo "== cluster: classroom, one node, run $i of $REPEAT"
  one_node bench_one_$i
  [ "${CLUSTER_SWITCHES:-0}" = 1 ] && switches "$OUT/cluster-switches-one-$i.txt" "$A"
  gen classroom --url "$(url_of 0)" --server-pid "$A" --rooms $ROOMS --players $PLAYERS \
    --warmup-s $WARM --duration-s $DUR --json "$OUT/cluster-classroom-one-$i.json"
  stop_nodes
  echo "== cluster: classroom, three nodes (hosts on A, players on B and C), run $i of $REPEAT"
  three_nodes bench_three_$i
  [ "${CLUSTER_SWITCHES:-0}" = 1 ] && switches "$OUT/cluster-switches-three-$i.txt" "$A,$B,$C"
  if [ "${CLUSTER_PERF:-0}" = 1 ]; then
    (sleep $((WARM + 1)); perf record -q ${CLUSTER_PERF_ARGS:--g} -o "$OUT/cluster-perf-$i.data" -p "$A,$B,$C" -- sleep 4 >/dev/null 2>&1) &
  fi
  gen classroom --url "$(url_of 0)" --player-url "$(url_of 1)" --player-url "$(url_of 2)" \
    --server-pid "$A" --node-pid "$B" --node-pid "$C" --side-pid "$NATS_PID" \
    --rooms $ROOMS --players $PLAYERS --warmup-s $WARM --duration-s $DUR --json "$OUT/cluster-classroom-three-$i.json"
  # Frames and the NATS messages (batches) that carried them, summed over
  # the three nodes: how many frames a batch held.
  for n in 0 1 2; do curl -sf "$(url_of $n)/metrics"; done \
    | awk '/^hostwire_cluster_frames_sent_total/ {f += $2} /^hostwire_cluster_batches_sent_total/ {b += $2}
           END {printf "%d %d\n", f, b}' > "$OUT/cluster-classroom-three-$i.batches"
  stop_nodes
done
if [ "${CLUSTER_ONLY:-}" = classroom ]; then
  for f in "$OUT"/cluster-classroom-three-*.batches; do
    read -r frames batches < "$f"; echo "$(basename "$f" .batches): $frames frames sent in $batches NATS messages"
  done
  for f in "$OUT"/cluster-switches-*.txt; do
    [ -f "$f" ] && echo "$(basename "$f" .txt): $(awk -F, '$3 == "context-switches" {s = $1} $3 == "task-clock" {c = $1} END {printf "%d context switches, %.0f ms of CPU in 4 s", s, c}' "$f")"
  done
  exit 0
fi

echo "== cluster: failover (A killed with SIGKILL, leases of $LEASE_TTL)"
three_nodes bench_failover
# The generator kills A itself: it knows the instant of the kill.
gen failover --url "$(url_of 0)" --player-url "$(url_of 1)" --player-url "$(url_of 2)" --kill-pid "$A" \
  --rooms $ROOMS --players $PLAYERS --warmup-s $WARM --json "$OUT/cluster-failover.json"
stop_nodes

echo "== cluster: idle, one node"
one_node bench_idle_one
gen idle --url "$(url_of 0)" --server-pid "$A" --connections $IDLE --hold-s 5 --json "$OUT/cluster-one-idle.json"
stop_nodes

echo "== cluster: idle, three nodes (rooms on A, connections to A, B and C in turn)"
three_nodes bench_idle_three
gen idle --url "$(url_of 0)" --player-url "$(url_of 0)" --player-url "$(url_of 1)" --player-url "$(url_of 2)" \
  --server-pid "$A" --node-pid "$B" --node-pid "$C" --connections $IDLE --hold-s 5 --json "$OUT/cluster-three-idle.json"
stop_nodes

CMD="bench/cluster.sh"; [ "$QUICK" = 1 ] && CMD="QUICK=1 $CMD"; [ "$LEASE_TTL" != 2s ] && CMD="LEASE_TTL=$LEASE_TTL $CMD"
"$BIN/hostwire-bench" cluster-report --results "$OUT" --command "$CMD" > "$OUT/cluster.md"
{
  echo
  for f in "$OUT"/cluster-classroom-three-*.batches; do
    read -r frames batches < "$f"
    echo "Frames between nodes, $(basename "$f" .batches | sed 's/cluster-classroom-three-/run /'): $frames sent in $batches NATS messages (summed over A, B and C)."
  done
} >> "$OUT/cluster.md"
cat "$OUT/cluster.md"
