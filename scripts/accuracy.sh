#!/usr/bin/env bash
# Accuracy on the standard workload (BENCHMARKS.md), judged by the
# aggregator's judge against each algorithm's own exact truth, at several
# phases of the trace against the window grid (a trace that starts on a
# window boundary flatters the sliding-window estimate):
#   1. offline: the edge's decision core in simulated time, one edge, no
#      distribution (loadtest offline -judge -phases 4);
#   2. live: a PoP of 2 edges on 3 memcached shards (or one redis-server),
#      events through the aggregator's embedded Kafka broker, the replay
#      started at each phase (loadtest replay -align 10s -phase P).
# For each algorithm × mode × store × phase it prints decisions, wrongly
# allowed / limited, wrong %, the worst wrongly allowed key's ratio to its
# limit and the store operations per request, then the worst and the mean
# over the phases.
#
# The standard workload: loadtest gen -kind mix -seed=1 -rate R -clients 2000
# -duration D -limit 100 (Zipf(1.1) clients, an abuser at twice the limit, a
# boundary double burst, a key flood, credential stuffing), against one rule:
# 100 per 10 s per client IP (buckets: rate 100 per 10 s, burst 100), throttle,
# flush interval 5 ms.
#
# The near-limit workload (-workload nearlimit): loadtest gen -kind nearlimit
# -seed=1 -clients C -limit 100 -window 10s -duration D (a quarter of the
# clients at 0.9-1.3x their limit, a tenth bursting at 3-8x).
#
# -spreads deals the live replay's requests to the edges by client (each
# client on one edge) and/or round-robin (every client over both edges);
# -sim on runs the same trace through the two-edge simulator (loadtest
# offline -edges 2 -spread S -rtt 500us, the edge's own cores in simulated
# time) beside the live runs, for the sliding window async.
#
# usage: scripts/accuracy.sh [-workload mix|nearlimit] [-rate R] [-clients C] [-duration D]
#          [-algorithms "A ..."] [-modes "async sync"] [-stores "memcached redis"]
#          [-spreads "by-client round-robin"] [-phases "0 2.5s 5s 7.5s"]
#          [-offline on|off] [-sim on|off] [-edge-flags "..."] [-sim-flags "..."] [-out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=500 DUR=20s OFFLINE=on OUT= WORKLOAD=mix CLIENTS=200 SPREADS=by-client SIM=off EDGEFLAGS= SIMFLAGS=
ALGS="sliding_window fixed_window token_bucket leaky_bucket sliding_log"
MODES="async sync" STORES="memcached redis" PHASES="0 2.5s 5s 7.5s"
while [ $# -gt 0 ]; do
  case "$1" in
    -rate) RATE=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;;
    -algorithms) ALGS=$2; shift 2 ;; -modes) MODES=$2; shift 2 ;;
    -stores) STORES=$2; shift 2 ;; -phases) PHASES=$2; shift 2 ;;
    -offline) OFFLINE=$2; shift 2 ;; -out) OUT=$2; shift 2 ;;
    -workload) WORKLOAD=$2; shift 2 ;; -clients) CLIENTS=$2; shift 2 ;;
    -spreads) SPREADS=$2; shift 2 ;; -sim) SIM=$2; shift 2 ;; -edge-flags) EDGEFLAGS=$2; shift 2 ;; -sim-flags) SIMFLAGS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for s in $STORES; do
  case $s in
    memcached) command -v memcached >/dev/null || { echo "accuracy: needs memcached: apt-get install memcached" >&2; exit 2; } ;;
    redis) command -v redis-server >/dev/null || { echo "accuracy: needs redis-server: apt-get install redis-server" >&2; exit 2; } ;;
    *) echo "accuracy: unknown store $s" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
pids=() sp=()
cleanup() { for p in "${pids[@]}" "${sp[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
for c in edge aggregator loadtest; do go build -o "$tmp/$c" ./cmd/$c; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

case $WORKLOAD in
  mix) "$tmp/loadtest" gen -kind mix -seed=1 -rate "$RATE" -clients 2000 -duration "$DUR" -limit 100 -o "$tmp/trace.jsonl" ;;
  nearlimit) "$tmp/loadtest" gen -kind nearlimit -seed=1 -clients "$CLIENTS" -limit 100 -window 10s -duration "$DUR" -o "$tmp/trace.jsonl" ;;
  *) echo "accuracy: unknown workload $WORKLOAD" >&2; exit 2 ;;
esac
echo "accuracy: $WORKLOAD workload: $(wc -l < "$tmp/trace.jsonl") trace lines for $DUR; phases: $PHASES; spreads: $SPREADS"
rules() { # name algorithm mode
  printf 'rules:\n  - name: %s\n    limit: 100\n    window: 10s\n    algorithm: %s\n    mode: %s\n' "$1" "$2" "$3"
  case $2 in token_bucket|leaky_bucket) printf '    burst: 100\n' ;; esac
}
modes_of() { if [ "$1" = sliding_log ]; then echo sync; else echo "$MODES"; fi; }

if [ "$OFFLINE" = on ]; then
  echo; echo "== 1. offline: one simulated edge, the edge's own core, judged, 4 phases"
  for alg in $ALGS; do
    for mode in $(modes_of "$alg"); do
      rules "off-$alg-$mode" "$alg" "$mode" > "$tmp/off.yaml"
      echo "-- $alg $mode"
      "$tmp/loadtest" offline -judge -phases 4 -rules "$tmp/off.yaml" -trace "$tmp/trace.jsonl" | head -8
    done
  done
fi

if [ "$SIM" = on ]; then
  echo; echo "== 1b. simulated PoP: 2 edges, 0.5 ms round trip, the edges' own cores, sliding window async, 4 phases"
  rules sim sliding_window async > "$tmp/sim.yaml"
  for spread in $SPREADS; do
    echo "-- $spread"
    "$tmp/loadtest" offline -judge -phases 4 -edges 2 -spread "$spread" -rtt 500us $SIMFLAGS -rules "$tmp/sim.yaml" -trace "$tmp/trace.jsonl" | tail -1
  done
fi

bp=$(port); ap=$(port)
"$tmp/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$ap" -lateness 2s -top-keys 1000 2>"$tmp/agg.log" & pids+=($!)
wait_port "$ap"
results="$tmp/results.tsv"
: > "$results"
run=0
for store in $STORES; do
  sp=()
  case $store in
    memcached)
      shards=()
      for i in 1 2 3; do p=$(port); memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & sp+=($!); wait_port "$p"; shards+=("127.0.0.1:$p"); done
      storeflag=(-memcache "$(IFS=,; echo "${shards[*]}")") ;;
    redis)
      p=$(port); redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning & sp+=($!); wait_port "$p"
      storeflag=(-redis "127.0.0.1:$p") ;;
  esac
  for alg in $ALGS; do
    for mode in $(modes_of "$alg"); do
      for spread in $SPREADS; do
      for phase in $PHASES; do
        run=$((run + 1))
        name="r$run-$alg-$mode-$store"
        rules "$name" "$alg" "$mode" > "$tmp/rules.yaml"
        eps=(); targets=(); admins=()
        for id in 1 2; do
          e=$(port); a=$(port)
          "$tmp/edge" -listen "127.0.0.1:$e" -admin "127.0.0.1:$a" -edge-id "$id" -rules "$tmp/rules.yaml" \
            "${storeflag[@]}" -brokers "127.0.0.1:$bp" -trusted-proxies 127.0.0.0/8 -log-level warn $EDGEFLAGS & eps+=($!)
          wait_port "$e"; targets+=("127.0.0.1:$e"); admins+=("127.0.0.1:$a")
        done
        "$tmp/loadtest" replay -targets "$(IFS=,; echo "${targets[*]}")" -trace "$tmp/trace.jsonl" -spread "$spread" -align 10s -phase "$phase" \
          -aggregator "http://127.0.0.1:$ap/report?flush=1" -aggregator-wait 4s -json > "$tmp/run.json" 2>"$tmp/replay.err"
        ops=0
        for a in "${admins[@]}"; do
          n=$(curl -s "http://$a/metrics" | awk '/^poplimit_window_store_ops_total /{print $2}')
          ops=$(python3 -c "print($ops + ${n:-0})")
        done
        for p in "${eps[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
        python3 - "$tmp/run.json" "$name" "$alg" "$mode" "$store/$spread" "$phase" "$ops" >> "$results" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1])); name, alg, mode, store, phase, ops = sys.argv[2:8]
agg = rep.get("aggregator") or {}
t = next((b["enforced"] for b in agg.get("by_rule", []) if b["name"] == name), None)
if t is None:
    print("\t".join([alg, mode, store, phase, "0", "0", "0", "nan", "nan", "nan"])); sys.exit()
worst = max([k.get("ratio", 0) for k in agg.get("top_false_negatives", []) if k.get("rule") == name] or [0])
req = max(rep.get("completed", 0), 1)
print("\t".join(str(x) for x in [alg, mode, store, phase, t["decisions"], t["wrongly_allowed"], t["wrongly_limited"],
      100 * t["wrong_ratio"], worst, float(ops) / req]))
PY
        tail -1 "$results" | awk -F'\t' '{printf "%-15s %-5s %-9s phase %-5s %7d decisions, wrongly allowed %5d, limited %5d, wrong %.4f%%, worst key %.3f×, store ops/req %.3f\n", $1,$2,$3,$4,$5,$6,$7,$8,$9,$10}'
      done
      done
    done
  done
  for p in "${sp[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
done

echo; echo "== 2. live PoP, 2 edges: worst and mean over the phases"
python3 - "$results" "${OUT:-/dev/null}" <<'PY'
import sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = collections.OrderedDict()
for r in rows:
    by.setdefault(tuple(r[:3]), []).append(r)
out = ["| algorithm | mode | store/spread | phases | decisions | wrong % worst / mean | wrongly allowed % worst | worst key ÷ limit | store ops/req |",
       "|---|---|---|---|---|---|---|---|---|"]
for (alg, mode, store), rs in by.items():
    wrong = [float(r[7]) for r in rs]; dec = [int(r[4]) for r in rs]
    wa = [100 * int(r[5]) / max(int(r[4]), 1) for r in rs]
    worst = max(float(r[8]) for r in rs); ops = sum(float(r[9]) for r in rs) / len(rs)
    out.append(f"| {alg} | {mode} | {store} | {len(rs)} | {sum(dec)//len(rs)} | {max(wrong):.3f} / {sum(wrong)/len(wrong):.3f} | "
               f"{max(wa):.3f} | {worst:.3f}× | {ops:.3f} |")
print("\n".join(out))
if sys.argv[2] != "/dev/null":
    open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
