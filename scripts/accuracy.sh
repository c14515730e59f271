#!/usr/bin/env bash
# Accuracy on the standard workload (BENCHMARKS.md), measured three ways on
# one trace by the aggregator's judge:
#   1. a single in-process sliding-window counter (loadtest offline -judge):
#      the algorithm's own error, with no distribution;
#   2. a live PoP in async mode: 2 edges, 3 memcached shards, events through
#      the aggregator's embedded Kafka broker;
#   3. the same PoP with the rule in sync mode.
# The standard workload: loadtest gen -kind mix -seed=1 -rate R -clients 2000
# -duration D -limit 100 (Zipf(1.1) clients, an abuser at twice the limit,
# a boundary double burst, a key flood, credential stuffing), against one
# rule: 100 requests per 10 s per client IP, sliding window, throttle;
# flush interval 5 ms.
#
# usage: scripts/accuracy.sh [-rate R] [-duration D]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=500 DUR=60s
while [ $# -gt 0 ]; do
  case "$1" in -rate) RATE=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;; *) echo "unknown flag $1" >&2; exit 2 ;; esac
done
command -v memcached >/dev/null || { echo "accuracy: needs memcached: apt-get install memcached" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
for c in edge aggregator loadtest; do go build -o "$tmp/$c" ./cmd/$c; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

"$tmp/loadtest" gen -kind mix -seed=1 -rate "$RATE" -clients 2000 -duration "$DUR" -limit 100 -o "$tmp/trace.jsonl"
echo "accuracy: standard workload: $(wc -l < "$tmp/trace.jsonl") trace lines, mix at $RATE/s for $DUR"
rules() { # name mode
  printf 'rules:\n  - name: %s\n    limit: 100\n    window: 10s\n    mode: %s\n' "$1" "$2"
}

echo; echo "== 1. single in-process sliding-window counter (offline, judged)"
rules std-offline async > "$tmp/offline.yaml"
"$tmp/loadtest" offline -judge -rules "$tmp/offline.yaml" -trace "$tmp/trace.jsonl" | head -3

shards=()
for i in 1 2 3; do p=$(port); memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & pids+=($!); wait_port "$p"; shards+=("127.0.0.1:$p"); done
bp=$(port); ap=$(port)
"$tmp/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$ap" -lateness 2s 2>"$tmp/agg.log" & pids+=($!)
wait_port "$ap"
for mode in async sync; do
  echo; echo "== $([ $mode = async ] && echo 2 || echo 3). live PoP, 2 edges, 3 memcached shards, $mode mode"
  rules "std-$mode" "$mode" > "$tmp/$mode.yaml"
  eps=(); targets=()
  for id in 1 2; do
    e=$(port); a=$(port)
    "$tmp/edge" -listen "127.0.0.1:$e" -admin "127.0.0.1:$a" -edge-id "$id" -rules "$tmp/$mode.yaml" \
      -memcache "$(IFS=,; echo "${shards[*]}")" -brokers "127.0.0.1:$bp" -trusted-proxies 127.0.0.0/8 -log-level warn & eps+=($!)
    wait_port "$e"; targets+=("127.0.0.1:$e")
  done
  "$tmp/loadtest" replay -targets "$(IFS=,; echo "${targets[*]}")" -trace "$tmp/trace.jsonl" -align 10s \
    -aggregator "http://127.0.0.1:$ap/report?flush=1" -aggregator-wait 4s -json > "$tmp/$mode.json"
  for p in "${eps[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
  python3 - "$tmp/$mode.json" "std-$mode" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1])); name = sys.argv[2]
agg = rep.get("aggregator") or {}
lat = rep["latency"]
print(f"replay: {rep['completed']} requests, p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms")
for b in agg.get("by_rule", []):
    if b["name"] == name:
        t = b["enforced"]
        print(f"judged {t['decisions']} decisions: wrongly allowed {t['wrongly_allowed']} ({100*t['wrongly_allowed_ratio']:.4f}%), "
              f"wrongly limited {t['wrongly_limited']} ({100*t['wrongly_limited_ratio']:.4f}%), wrong {100*t['wrong_ratio']:.4f}%")
print(f"(cumulative over the runs so far) mean relative error {100*agg.get('mean_relative_error', 0):.2f}%, late events {agg.get('late', 0)}")
for k in agg.get("top_false_negatives", [])[:3]:
    print("  worst wrongly allowed key:", {x: k[x] for x in k if x in ("rule", "key_hash", "wrong_decisions", "ratio")})
PY
done
