#!/usr/bin/env bash
# Where one edge's CPU goes, under the load of scripts/bench-edge.sh: one
# edge (decision mode, 3 memcached shards, decision events to the
# aggregator's embedded broker) alone on CPU 1 with GOMAXPROCS=1, wrk -t1
# -c64 over 10,000 Zipf(1.1) API keys, memcached and the aggregator on
# CPU 0. It prints wrk's req/s and latency, the edge's CPU per request, the
# CPU of every other process in cores, and keeps the server's CPU profile
# (cpu.pprof; with -path bare, the bare server's), the aggregator's
# (aggregator.pprof) and the edge's /metrics at the end of the run. Use it
# to compare two builds of the edge (-bin, alternated by the caller) or to
# see what a change moved; scripts/bench-edge.sh is the side-by-side
# benchmark.
#
# usage: scripts/profile-edge.sh [-path /async/x|/sync/x|/tb/x|/blocked/x|bare] [-duration S]
#          [-bin EDGE_BINARY] [-profile on|off] [-out DIR] [-idle] [-delay MS]
#   -path      the rule the load hits (bare: loadtest/bare instead of the edge)
#   -bin       an edge binary to run instead of building ./cmd/edge
#   -out       where cpu.pprof, metrics.txt and wrk.txt go (default: a temporary directory, printed)
#   -idle      no load: the edge's CPU over 10 s after one request (what an idle edge costs)
#   -delay     each wrk connection waits MS milliseconds between requests (an offered
#              rate below saturation, the same for every server; default 0: closed loop)
# EDGE_FLAGS: more flags for the edge (e.g. "-memcache-protocol meta").
# Needs wrk, memcached, taskset, bc; the profile covers the run less 2 s.
set -euo pipefail
cd "$(dirname "$0")/.."
P=/async/x D=8 BIN="" PROFILE=on OUT="" IDLE=0 DELAY=0
while [ $# -gt 0 ]; do
  case "$1" in
    -path) P=$2; shift 2 ;; -duration) D=$2; shift 2 ;; -bin) BIN=$2; shift 2 ;;
    -profile) PROFILE=$2; shift 2 ;; -out) OUT=$2; shift 2 ;; -idle) IDLE=1; shift ;; -delay) DELAY=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in wrk memcached taskset bc; do
  command -v $b >/dev/null || { echo "profile-edge: needs $b: apt-get install $b" >&2; exit 2; }
done
[ "$(nproc)" -ge 2 ] || { echo "profile-edge: needs two CPUs (the edge alone on CPU 1)" >&2; exit 2; }
[ -n "$OUT" ] || OUT=$(mktemp -d)
mkdir -p "$OUT"
bin=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$bin"; }
trap cleanup EXIT INT TERM
[ -n "$BIN" ] || { go build -o "$bin/edge" ./cmd/edge; BIN=$bin/edge; }
go build -o "$bin/aggregator" ./cmd/aggregator
go build -o "$bin/bare" ./loadtest/bare
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 300); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "profile-edge: port $1 never opened" >&2; return 1; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
snapshot() { for p in "${pids[@]}"; do echo "$p $(cat "/proc/$p/comm") $(ticks "$p")"; done | sort; }
shards=()
for _ in 1 2 3; do
  p=$(port); taskset -c 0 memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & pids+=($!); wait_port "$p"; shards+=("127.0.0.1:$p")
done
bp=$(port)
al=$(port)
taskset -c 0 "$bin/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$al" -pprof 2>"$OUT/aggregator.log" & pids+=($!)
wait_port "$bp"
cat > "$bin/rules.yaml" <<'RULES'
rules:
  - {name: async, path_prefix: /async, key: ["header:X-API-Key"], limit: 100000000, window: 1m}
  - {name: sync, path_prefix: /sync, key: ["header:X-API-Key"], limit: 100000000, window: 1m, mode: sync}
  - {name: sync-tb, path_prefix: /tb, key: ["header:X-API-Key"], limit: 100000000, window: 1m, algorithm: token_bucket, mode: sync}
  - {name: blocked, path_prefix: /blocked, key: ["header:X-API-Key"], limit: 10, window: 1m}
RULES
ep=$(port) ea=$(port)
if [ "$P" = bare ]; then
  env GOMAXPROCS=1 taskset -c 1 "$bin/bare" -listen "127.0.0.1:$ep" -pprof "127.0.0.1:$ea" & pids+=($!)
  P=/
else
  env GOMAXPROCS=1 taskset -c 1 "$BIN" -listen "127.0.0.1:$ep" -admin "127.0.0.1:$ea" -edge-id 1 -log-level warn \
    -brokers "127.0.0.1:$bp" -rules "$bin/rules.yaml" -memcache "$(IFS=,; echo "${shards[*]}")" -pprof ${EDGE_FLAGS:-} 2>"$OUT/edge.log" & pids+=($!)
fi
srv=$!
wait_port "$ep"
if [ "$IDLE" = 1 ]; then
  sleep 2; curl -s -H 'X-API-Key: k' "http://127.0.0.1:$ep/async/x" >/dev/null; sleep 1
  s0=$(ticks $srv); sleep 10; s1=$(ticks $srv)
  echo "idle CPU over 10 s: $(echo "($s1 - $s0) / $(getconf CLK_TCK) / 10 * 100" | bc -l | awk '{ printf "%.2f", $1 }') % of a core"
  exit 0
fi
WRK_PATH=$P WRK_LIMIT=100000000 taskset -c 0 wrk -t1 -c64 -d2s -s loadtest/wrk/zipf.lua "http://127.0.0.1:$ep" >/dev/null # warm-up
snapshot > "$bin/cpu0"; t0=$(date +%s.%N)
WRK_PATH=$P WRK_LIMIT=100000000 WRK_DELAY_MS=$DELAY taskset -c 0 wrk -t1 -c64 -d"${D}s" --latency -s loadtest/wrk/zipf.lua "http://127.0.0.1:$ep" > "$OUT/wrk.txt" 2>&1 &
wp=$!
if [ "$PROFILE" = on ]; then
  curl -s -o "$OUT/aggregator.pprof" "http://127.0.0.1:$al/debug/pprof/profile?seconds=$((D - 2))" &
  curl -s -o "$OUT/cpu.pprof" "http://127.0.0.1:$ea/debug/pprof/profile?seconds=$((D - 2))"
  wait $!
fi
wait $wp
secs=$(echo "$(date +%s.%N) - $t0" | bc -l)
snapshot > "$bin/cpu1"
[ "$P" = / ] || curl -s "http://127.0.0.1:$ea/metrics" > "$OUT/metrics.txt"
reqs=$(awk '/requests in/ { print $1 }' "$OUT/wrk.txt")
awk '/Requests\/sec/ { print "req/s " $2 } / 50%/ { print "p50 " $2 } / 99%/ { print "p99 " $2 } /Non-2xx/ { print "non-2xx " $5 }' "$OUT/wrk.txt"
join "$bin/cpu0" "$bin/cpu1" | awk -v s="$secs" -v hz="$(getconf CLK_TCK)" '{ printf "cpu %s %s %.3f cores\n", $1, $2, ($5 - $3) / hz / s }'
a=$(awk -v p=$srv '$1 == p { print $3 }' "$bin/cpu0") b=$(awk -v p=$srv '$1 == p { print $3 }' "$bin/cpu1")
echo "server cpu/req µs $(echo "($b - $a) / $(getconf CLK_TCK) / $reqs * 1000000" | bc -l | awk '{ printf "%.2f", $1 }')"
echo "profile-edge: files in $OUT" >&2
