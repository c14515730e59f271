#!/usr/bin/env bash
# Measures the edge's cost side by side in one run (BENCHMARKS.md): the same
# wrk load (Zipf keys over 10,000 API keys) against a bare fasthttp server
# that answers 200, and against one edge in decision mode with three
# memcached shards behind it, on four paths:
#   /async    async rule, limits no key reaches (every request allowed)
#   /sync     the same rule in sync mode (one memcached round trip each)
#   /blocked  a rule that most requests exceed (answered from the block cache)
# with decision events flowing to the aggregator's embedded Kafka broker when
# the aggregator is built (-events off to skip). Targets alternate, R rounds.
#
# The server under test (bare or the edge) runs pinned to CPU 1 and
# everything else (wrk, memcached, the broker and aggregator) to CPU 0 when
# the machine has two CPUs and taskset (-pin off to share both), so that
# the server's CPU per request is its own: user + system CPU of its process
# divided by the requests it answered.
#
# usage: scripts/bench-edge.sh [-rounds R] [-duration S] [-conns C] [-events on|off] [-pin on|off]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=5 CONNS=64 EVENTS=on PIN=on
while [ $# -gt 0 ]; do
  case "$1" in
    -rounds) ROUNDS=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;;
    -conns) CONNS=$2; shift 2 ;; -events) EVENTS=$2; shift 2 ;; -pin) PIN=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in wrk memcached; do
  command -v $b >/dev/null || { echo "bench-edge: needs $b: apt-get install $b" >&2; exit 2; }
done

SRV="" REST=""
if [ "$PIN" = on ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then SRV="taskset -c 1" REST="taskset -c 0"; fi
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

go build -o "$tmp/edge" ./cmd/edge
go build -o "$tmp/bare" ./loadtest/bare
have_agg=0
if [ "$EVENTS" = on ] && [ -d cmd/aggregator ] && go build -o "$tmp/aggregator" ./cmd/aggregator 2>/dev/null; then have_agg=1; fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

shards=()
for i in 1 2 3; do
  p=$(port); $REST memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & pids+=($!); wait_port "$p"; shards+=("127.0.0.1:$p")
done
brokers=""
if [ $have_agg = 1 ]; then
  bp=$(port); ap=$(port)
  $REST "$tmp/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$ap" ${AGG_FLAGS:-} 2>"$tmp/agg.log" & pids+=($!)
  wait_port "$bp"; brokers="127.0.0.1:$bp"
fi
cat > "$tmp/rules.yaml" <<RULES
rules:
  - name: async
    path_prefix: /async
    key: ["header:X-API-Key"]
    limit: 1000000
    window: 1m
  - name: sync
    path_prefix: /sync
    key: ["header:X-API-Key"]
    limit: 1000000
    window: 1m
    mode: sync
  - name: blocked
    path_prefix: /blocked
    key: ["header:X-API-Key"]
    limit: 10
    window: 1m
RULES
bare=$(port); edge=$(port); admin=$(port)
$SRV "$tmp/bare" -listen "127.0.0.1:$bare" & pids+=($!)
args=(-listen "127.0.0.1:$edge" -admin "127.0.0.1:$admin" -rules "$tmp/rules.yaml" -memcache "$(IFS=,; echo "${shards[*]}")" -log-level warn)
[ -n "$brokers" ] && args+=(-brokers "$brokers")
$SRV "$tmp/edge" "${args[@]}" & pids+=($!)
wait_port "$bare"; wait_port "$edge"

cpu_ticks() { # pid → user+system clock ticks so far
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
HZ=$(getconf CLK_TCK)
run_wrk() { # target path conns → "rps p50_us p99_us non2xx"
  WRK_PATH=$2 ${REST:-} wrk -t1 -c"$3" -d"${DUR}s" --latency -s loadtest/wrk/zipf.lua "http://127.0.0.1:$1" 2>&1 | awk '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return v*1000; if (v ~ /s$/) return v*1000000; return v }
    /Requests\/sec/ { rps=$2 } / 50%/ { p50=us($2) } / 99%/ { p99=us($2) } /Non-2xx/ { n=$5 }
    END { printf "%.0f %.0f %.0f %d\n", rps, p50, p99, n }'
}
echo "bench-edge: $ROUNDS rounds of ${DUR}s, wrk -t1 -c$CONNS, 10,000 Zipf(1.1) keys; events: $([ -n "$brokers" ] && echo "to the embedded broker" || echo off)"
# CPU in cores over each run: the generator (wrk), the server under test,
# and everything else (memcached, broker, aggregator) — what limited it.
echo "pinning: $([ -n "$SRV" ] && echo "server under test on CPU 1, the rest on CPU 0" || echo off)"
printf "%-6s %-9s %10s %9s %9s %9s %7s %7s %7s %9s\n" round target req/s p50_us p99_us non2xx wrk srv rest cpu/req_us
bare_pid=${pids[-2]} edge_pid=${pids[-1]}
total_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
for r in $(seq "$ROUNDS"); do
  for t in bare async sync blocked; do
    srv=$edge_pid; [ $t = bare ] && srv=$bare_pid
    s0=$(cpu_ticks "$srv"); a0=$(total_ticks)
    start=$(date +%s.%N)
    case $t in bare) res=$(/usr/bin/time -f "%U %S" -o "$tmp/wrkcpu" bash -c "$(declare -f run_wrk); DUR=$DUR REST='$REST'; run_wrk $bare / $CONNS") ;;
               *) res=$(/usr/bin/time -f "%U %S" -o "$tmp/wrkcpu" bash -c "$(declare -f run_wrk); DUR=$DUR REST='$REST'; run_wrk $edge /$t/x $CONNS") ;; esac
    secs=$(echo "$(date +%s.%N) - $start" | bc -l)
    s1=$(cpu_ticks "$srv"); a1=$(total_ticks)
    wcpu=$(awk -v d="$secs" '{ printf "%.2f", ($1 + $2) / d }' "$tmp/wrkcpu")
    scpu=$(echo "($s1 - $s0) / $HZ / $secs" | bc -l)
    rest=$(echo "($a1 - $a0) / $HZ / $secs - $scpu - $wcpu" | bc -l)
    read -r rps p50 p99 n <<<"$res"
    cpr=$(echo "($s1 - $s0) / $HZ / ($rps * $secs) * 1000000" | bc -l)
    printf "%-6s %-9s %10s %9s %9s %9s %7.2f %7.2f %7.2f %9.2f\n" "$r" "$t" "$rps" "$p50" "$p99" "$n" "$wcpu" "$scpu" "$rest" "$cpr"
    echo "$r $t $rps $p50 $p99 $n $cpr" >> "$tmp/results"
  done
done
# Unloaded latency: one connection, one request at a time.
for t in bare async; do
  case $t in bare) res=$(run_wrk "$bare" / 1) ;; *) res=$(run_wrk "$edge" "/async/x" 1) ;; esac
  echo "lat $t $res" >> "$tmp/results"
done
awk '
  $1=="lat" { lat50[$2]=$4; lat99[$2]=$5; next }
  { rps[$1,$2]=$3; p50[$2]+=$4; p99[$2]+=$5; n[$2]++; rounds[$1]=1; cpr[$1,$2]=$7 }
  END {
    for (r in rounds) { ra[r]=rps[r,"async"]/rps[r,"bare"]; rb[r]=rps[r,"blocked"]/rps[r,"bare"]; rs[r]=rps[r,"sync"]/rps[r,"async"] }
    print ""
    print "ratios per round (min / median / max):"
    split("ra rb rs", names, " ")
    label["ra"]="edge async ÷ bare (allowed)      "; label["rb"]="edge blocked ÷ bare (block cache)"; label["rs"]="sync ÷ async                      "
    for (k=1;k<=3;k++) {
      nm=names[k]; c=0
      for (r in rounds) { v[++c] = (nm=="ra"?ra[r]:(nm=="rb"?rb[r]:rs[r])) }
      for (i=1;i<=c;i++) for (j=i+1;j<=c;j++) if (v[j]<v[i]) { x=v[i]; v[i]=v[j]; v[j]=x }
      printf "  %s %.3f / %.3f / %.3f\n", label[nm], v[1], v[int((c+1)/2)], v[c]
    }
    for (r in rounds) { ca[r]=cpr[r,"async"]/cpr[r,"bare"]; cb[r]=cpr[r,"blocked"]/cpr[r,"bare"]; cs[r]=cpr[r,"sync"]/cpr[r,"bare"] }
    print "server CPU per request, as a ratio to bare, per round (min / median / max):"
    split("ca cb cs", cn, " ")
    clabel["ca"]="async  "; clabel["cb"]="blocked"; clabel["cs"]="sync   "
    for (k=1;k<=3;k++) {
      nm=cn[k]; c=0
      for (r in rounds) { w[++c] = (nm=="ca"?ca[r]:(nm=="cb"?cb[r]:cs[r])) }
      for (i=1;i<=c;i++) for (j=i+1;j<=c;j++) if (w[j]<w[i]) { x=w[i]; w[i]=w[j]; w[j]=x }
      printf "  %s %.2f / %.2f / %.2f\n", clabel[nm], w[1], w[int((c+1)/2)], w[c]
    }
    printf "mean latency under load (p50/p99 us): bare %.0f/%.0f  async %.0f/%.0f  sync %.0f/%.0f  blocked %.0f/%.0f\n", p50["bare"]/n["bare"], p99["bare"]/n["bare"], p50["async"]/n["async"], p99["async"]/n["async"], p50["sync"]/n["sync"], p99["sync"]/n["sync"], p50["blocked"]/n["blocked"], p99["blocked"]/n["blocked"]
    printf "unloaded latency, one connection (p50/p99 us): bare %s/%s  edge async %s/%s  → p99 added by the edge: %d us\n", lat50["bare"], lat99["bare"], lat50["async"], lat99["async"], lat99["async"]-lat99["bare"]
  }' "$tmp/results"
if [ -n "$brokers" ]; then
  echo "edge events: $(curl -s "http://127.0.0.1:$admin/metrics" | grep -E '^poplimit_pipeline_events_(emitted|dropped|delivered)_total' | tr '\n' ' ')"
fi
