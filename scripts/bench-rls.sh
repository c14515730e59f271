#!/usr/bin/env bash
# Envoy's rate limit service under the same gRPC load, side by side in one
# run: poplimit's (-rls-listen; the descriptors as envoyproxy/ratelimit
# decides them, sync, one memcached round trip each; and with the file's
# one-line switch to async) against envoyproxy/ratelimit itself with its
# memcache backend, built with `go install` from the Go module proxy. One
# memcached shard behind each. The server under test is pinned to CPU 1,
# the load generator (loadtest/rlsload: the generated client of
# go-control-plane) and memcached to CPU 0; targets alternate, R rounds.
# It prints calls/s, p50/p99 (µs) and the server's CPU per call (µs).
#
# envoyproxy/ratelimit's settings: BACKEND_TYPE=memcache, USE_STATSD=false,
# LOG_LEVEL=warn, RUNTIME_WATCH_ROOT=false, everything else its defaults.
#
# usage: scripts/bench-rls.sh [-rounds R] [-duration S]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=5
while [ $# -gt 0 ]; do
  case "$1" in -rounds) ROUNDS=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;; *) echo "unknown flag $1" >&2; exit 2 ;; esac
done
command -v memcached >/dev/null || { echo "bench-rls: needs memcached: apt-get install memcached" >&2; exit 2; }
gobin=$(go env GOPATH)/bin
if [ ! -x "$gobin/service_cmd" ]; then
  echo "bench-rls: building envoyproxy/ratelimit (go install github.com/envoyproxy/ratelimit/src/service_cmd@latest)"
  GOFLAGS= go install github.com/envoyproxy/ratelimit/src/service_cmd@latest
fi
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
SRV="" REST=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then SRV="taskset -c 1" REST="taskset -c 0"; fi
go build -o "$tmp/edge" ./cmd/edge
go build -o "$tmp/rlsload" ./loadtest/rlsload
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
memc() { local p; p=$(port); $REST memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & pids+=($!); wait_port "$p"; mc=$p; }
conf='domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100000000}'
mkdir -p "$tmp/pl-sync" "$tmp/pl-async" "$tmp/rl/ratelimit/config"
echo "$conf" > "$tmp/pl-sync/bench.yaml"
printf 'poplimit: {mode: async}\n%s\n' "$conf" > "$tmp/pl-async/bench.yaml"
echo "$conf" > "$tmp/rl/ratelimit/config/bench.yaml"

declare -A addr pid
for t in sync async; do
  memc; g=$(port)
  $SRV "$tmp/edge" -listen "127.0.0.1:$(port)" -admin "127.0.0.1:$(port)" -rules "$tmp/pl-$t" -rls-listen "127.0.0.1:$g" \
    -memcache "127.0.0.1:$mc" -log-level warn & pids+=($!); pid[poplimit-$t]=$!
  wait_port "$g"; addr[poplimit-$t]=127.0.0.1:$g
done
memc; g=$(port)
env RUNTIME_ROOT="$tmp/rl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true \
  USE_STATSD=false LOG_LEVEL=warn BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="127.0.0.1:$mc" \
  HOST=127.0.0.1 PORT="$(port)" GRPC_HOST=127.0.0.1 GRPC_PORT="$g" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(port)" \
  $SRV "$gobin/service_cmd" >"$tmp/rl.log" 2>&1 & pids+=($!); pid[ratelimit]=$!
wait_port "$g"; addr[ratelimit]=127.0.0.1:$g

HZ=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
printf '%-6s %-15s %10s %8s %8s %7s %10s\n' round target 'calls/s' p50_us p99_us failed cpu/call_us
for r in $(seq "$ROUNDS"); do
  for t in poplimit-sync poplimit-async ratelimit; do
    c0=$(ticks "${pid[$t]}")
    read -r rps p50 p99 failed < <($REST "$tmp/rlsload" -target "${addr[$t]}" -duration "${DUR}s")
    c1=$(ticks "${pid[$t]}")
    cpu=$(echo "($c1 - $c0) / $HZ / ($rps * $DUR) * 1000000" | bc -l)
    printf '%-6s %-15s %10s %8s %8s %7s %10.2f\n' "$r" "$t" "$rps" "$p50" "$p99" "$failed" "$cpu"
  done
done
