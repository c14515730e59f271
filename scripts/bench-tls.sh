#!/usr/bin/env bash
# TLS against plain HTTP through one edge, side by side in one run: the edge
# (decision mode, in-memory store, a rule no request exceeds) serves the same
# wrk load plain and over TLS, alternated, R rounds, and prints requests/s
# and p99 of each, with keep-alive connections (requests/s over TLS) and
# with a new connection per request (Connection: close: a TLS handshake per
# request). The edge is pinned to CPU 1 and wrk to CPU 0 when there are two.
#
# usage: scripts/bench-tls.sh [-rounds R] [-duration S] [-conns C]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=5 CONNS=32
while [ $# -gt 0 ]; do
  case "$1" in
    -rounds) ROUNDS=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;; -conns) CONNS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in wrk openssl; do command -v $b >/dev/null || { echo "bench-tls: needs $b: apt-get install $b" >&2; exit 2; }; done
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
pin_edge="" pin_wrk=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then pin_edge="taskset -c 1" pin_wrk="taskset -c 0"; fi

go build -o "$tmp/edge" ./cmd/edge
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
printf 'rules:\n  - {name: roomy, limit: 1000000000, window: 1m}\n' > "$tmp/rules.yaml"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
started=""
start() { # name, extra flags...; sets started to its port
  local p a; p=$(port); a=$(port); local name=$1; shift
  $pin_edge "$tmp/edge" -listen "127.0.0.1:$p" -admin "127.0.0.1:$a" -rules "$tmp/rules.yaml" -log-level warn "$@" 2>"$tmp/$name.log" & pids+=($!)
  wait_port "$p"; started=$p
}
start plain; plain=$started
start tls -tls-cert "$tmp/cert.pem" -tls-key "$tmp/key.pem"; tlsp=$started
run() { # url, extra wrk args...
  local url=$1; shift
  $pin_wrk wrk -t1 -c"$CONNS" -d"${DUR}s" --latency "$@" "$url" 2>&1 | awk '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} END {printf "%s %s", rps, p99}'
}
printf '%-6s %-10s %14s %8s\n' round target 'requests/s' p99
for r in $(seq "$ROUNDS"); do
  for t in plain tls plain-close tls-close; do
    case $t in
      plain) out=$(run "http://127.0.0.1:$plain/check/x") ;;
      tls) out=$(run "https://127.0.0.1:$tlsp/check/x") ;;
      plain-close) out=$(run "http://127.0.0.1:$plain/check/x" -H "Connection: close") ;;
      tls-close) out=$(run "https://127.0.0.1:$tlsp/check/x" -H "Connection: close") ;;
    esac
    printf '%-6s %-10s %14s %8s\n' "$r" "$t" $out
  done
done
