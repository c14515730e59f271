#!/usr/bin/env bash
# How cost grows with the work (BENCHMARKS.md):
#   A. throughput and edge memory with 10^3, 10^5 and 10^6 active keys
#      (wrk, uniform keys, one edge in async mode, 3 memcached shards);
#   B. store operations per request and accuracy as the flush interval
#      varies (0 = sync mode, 1, 5, 20 ms): the standard workload replayed
#      through 2 edges, judged by the aggregator. The accuracy-for-cost curve.
#
# usage: scripts/bench-long.sh [-duration S] [-rate R] [-trace-duration D] [-parts AB] [-flush "0 1ms 5ms 20ms"]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=10 RATE=2000 TRACE_DUR=30s PARTS=AB FLUSH="0 1ms 5ms 20ms"
while [ $# -gt 0 ]; do
  case "$1" in -duration) DUR=$2; shift 2 ;; -rate) RATE=$2; shift 2 ;; -trace-duration) TRACE_DUR=$2; shift 2 ;;
    -parts) PARTS=$2; shift 2 ;; -flush) FLUSH=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;; esac
done
for b in wrk memcached; do command -v $b >/dev/null || { echo "bench-long: needs $b: apt-get install $b" >&2; exit 2; }; done
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
for c in edge aggregator loadtest; do go build -o "$tmp/$c" ./cmd/$c; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
metric() { # admin name → value (summed over series)
  curl -s "http://$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.0f", s }'
}
shards=()
for i in 1 2 3; do p=$(port); memcached -l 127.0.0.1 -p "$p" -U 0 -m 1024 -t 1 -u root & pids+=($!); wait_port "$p"; shards+=("127.0.0.1:$p"); done
MC=$(IFS=,; echo "${shards[*]}")

if [[ $PARTS == *A* ]]; then
echo "== A. throughput and edge memory by active keys (wrk -t1 -c64, uniform keys; ${DUR}s, 6x as long for 10^6 so most keys are touched)"
printf 'rules:\n  - name: keys\n    key: ["header:X-API-Key"]\n    limit: 1000000\n    window: 1m\n' > "$tmp/keys.yaml"
printf "%10s %10s %12s %12s %10s\n" keys req/s edge_rss_MB local_keys p99_us
for n in 1000 100000 1000000; do
  e=$(port); a=$(port)
  "$tmp/edge" -listen "127.0.0.1:$e" -admin "127.0.0.1:$a" -rules "$tmp/keys.yaml" -memcache "$MC" -log-level warn -max-keys 2000000 & ep=$!
  wait_port "$e"
  d=$DUR; [ "$n" -ge 1000000 ] && d=$((DUR * 6))
  out=$(WRK_KEYS=$n WRK_ZIPF_S=0 WRK_PATH=/ wrk -t1 -c64 -d"${d}s" --latency -s loadtest/wrk/zipf.lua "http://127.0.0.1:$e" 2>&1)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '/ 99%/ {v=$2; if (v ~ /ms$/) v=v*1000; else if (v ~ /us$/) v=v+0; print v}')
  rss=$(metric "127.0.0.1:$a" process_resident_memory_bytes); keys=$(metric "127.0.0.1:$a" poplimit_window_keys)
  printf "%10s %10s %12.1f %12s %10s\n" "$n" "$rps" "$(echo "$rss/1048576" | bc -l)" "$keys" "$p99"
  kill $ep; wait $ep 2>/dev/null || true
done

fi

if [[ $PARTS == *B* ]]; then
echo; echo "== B. store operations per request and accuracy by flush interval (standard workload, $RATE/s for $TRACE_DUR, 2 edges)"
"$tmp/loadtest" gen -kind mix -seed=1 -rate "$RATE" -clients 2000 -duration "$TRACE_DUR" -limit 100 -o "$tmp/trace.jsonl"
printf "%8s %10s %14s %16s %16s %10s %10s %10s %18s\n" flush requests store_ops/req wrongly_allowed wrongly_limited wrong fallbacks late fallback_class_wa
for fi in $FLUSH; do
  bp=$(port); ap=$(port)
  "$tmp/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$ap" -lateness 2s 2>/dev/null & agp=$!
  wait_port "$ap"
  mode=async flush=$fi
  if [ "$fi" = 0 ]; then mode=sync flush=5ms; fi
  printf 'rules:\n  - name: std\n    limit: 100\n    window: 10s\n    mode: %s\n' "$mode" > "$tmp/std.yaml"
  eps=(); targets=(); admins=()
  for id in 1 2; do
    e=$(port); a=$(port)
    "$tmp/edge" -listen "127.0.0.1:$e" -admin "127.0.0.1:$a" -edge-id "$id" -rules "$tmp/std.yaml" -flush-interval "$flush" \
      -memcache "$MC" -brokers "127.0.0.1:$bp" -trusted-proxies 127.0.0.0/8 -log-level warn & eps+=($!)
    wait_port "$e"; targets+=("127.0.0.1:$e"); admins+=("127.0.0.1:$a")
  done
  "$tmp/loadtest" replay -targets "$(IFS=,; echo "${targets[*]}")" -trace "$tmp/trace.jsonl" -align 10s \
    -aggregator "http://127.0.0.1:$ap/report?flush=1" -aggregator-wait 4s -json > "$tmp/r.json"
  ops=0 fb=0
  for a in "${admins[@]}"; do
    ops=$((ops + $(metric "$a" poplimit_window_store_ops_total)))
    fb=$((fb + $(metric "$a" poplimit_window_fallbacks_total)))
  done
  for p in "${eps[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
  kill $agp; wait $agp 2>/dev/null || true
  python3 - "$tmp/r.json" "$fi" "$ops" "$fb" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1])); fi, ops, fb = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
agg = rep.get("aggregator") or {}
t = agg.get("enforced", {})
n = rep["completed"]
print(f"{fi if fi != '0' else '0 (sync)':>8} {n:>10} {ops/n:>14.3f} {t.get('wrongly_allowed',0):>9} ({100*t.get('wrongly_allowed_ratio',0):.3f}%) {t.get('wrongly_limited',0):>9} ({100*t.get('wrongly_limited_ratio',0):.3f}%) {100*t.get('wrong_ratio',0):>9.3f}% {fb:>10} {agg.get('late',0):>10} {agg.get('fallback',{}).get('wrongly_allowed',0):>18}")
PY
done
fi
