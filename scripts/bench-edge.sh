#!/usr/bin/env bash
# The edge's cost per request, side by side in one run (BENCHMARKS.md):
# every target below gets the same closed-loop load in turn, targets
# alternated within each of R rounds, each turn of a target between turns
# of its reference (the row's own bare server), and each row reports req/s,
# p50/p99, the server's CPU per request, its CPU, p99 and req/s as ratios
# to the reference turns beside it, and its req/s as a ratio to the peers'
# (gubernator and envoyproxy/ratelimit) in the same round.
#
# HTTP targets: wrk -t1 -cC, 10,000 API keys drawn by Zipf(1.1)
# (loadtest/wrk/zipf.lua; the peers' JSON APIs get the same keys as
# loadtest/benchwrk/post.lua POSTs):
#   bare             loadtest/bare: fasthttp answering 200 (the edge's server settings)
#   async            the edge (cmd/edge, decision mode, 3 memcached shards), a rule no key reaches
#   sync             the same rule in sync mode (a memcached round trip each)
#   blocked          a rule of 10 a minute most requests exceed (the block cache answers)
#   redis-async      the edge with the Redis store (-redis, one redis-server), async rule
#   redis-sync       the same, sync rule (a Redis round trip each)
#   sync-tb, redis-sync-tb  a sync token bucket on memcached (gets + cas) and on
#                    Redis (one script call), read against the sync sliding window
#   nethttp-bare     loadtest/middlewarebench: net/http answering 200 "ok"
#   nethttp          the same handler behind middleware.New (edge.Build, 3 memcached shards), async rule
#   fasthttp-bare    loadtest/middlewarebench: fasthttp answering 200 "ok"
#   fasthttp         the same handler behind the edge server's Wrap (as fasthttpmw.New), async rule
#   gubernator       gubernator, one node, HTTP API (POST /v1/GetRateLimits, one token bucket check)
#   ratelimit-json   envoyproxy/ratelimit, memcache backend, POST /json
# gRPC targets (Envoy's rate limit service), loadtest/rlsload: 4
# connections × 16 callers, one descriptor a call over 10,000 values:
#   rls-bare         loadtest/benchrlsbare: grpc-go answering OVERALL_OK without looking
#   rls-sync         the edge's -rls-listen, envoyproxy/ratelimit's semantics (one memcached shard)
#   rls-async        the same with the file's `poplimit: {mode: async}`
#   ratelimit-grpc   envoyproxy/ratelimit, memcache backend (its own memcached shard)
# The peers are built with `go install` from the Go module proxy when
# missing (envoyproxy/ratelimit's service_cmd@latest; gubernator's
# cmd/gubernator@latest, else GUBERNATOR_VERSION, default v2.13.0); a peer
# that cannot be built is said and its rows skipped, and so are the Redis
# rows without redis-server (installed with apt-get when root, as
# scripts/test.sh does).
#
# Decision events of every poplimit edge flow to the aggregator's embedded
# Kafka broker when it builds (-events off: none). The server under test
# runs alone on CPU 1 for its turn (GOMAXPROCS=1; taskset moves it there and
# back) and everything else
# (wrk or rlsload, memcached, redis, the broker and aggregator, and the
# servers waiting for their turn) on CPU 0 when the machine has two CPUs
# and taskset (-pin off: no pinning), so that its CPU per request is its
# own: user + system CPU of its process divided by the requests it
# answered.
#
# usage: scripts/bench-edge.sh [-rounds R] [-duration S] [-warmup S] [-conns C]
#          [-events on|off] [-pin on|off] [-peers on|off] [-targets "t1 t2 ..."] [-out FILE]
#          [-delay MS]
# -delay MS: each wrk connection waits MS milliseconds after a response
# (an offered rate of about C × 1000 / (MS + latency) a second, below
# saturation and about the same for every HTTP target), to compare CPU per
# request at one rate rather than in the closed loop; gRPC rows ignore it.
# QUICK=1: 1 round of 2 s (to check the script works); BENCH_OUT=FILE as -out.
# The markdown table goes to stdout and, with -out, to FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=8 WARM=1 CONNS=64 EVENTS=on PIN=on PEERS=on OUT=${BENCH_OUT:-} DELAY=0
if [ "${QUICK:-0}" = 1 ]; then ROUNDS=1 DUR=2 WARM=1; fi
ALL="bare async sync sync-tb blocked redis-async redis-sync redis-sync-tb nethttp-bare nethttp fasthttp-bare fasthttp gubernator ratelimit-json rls-bare rls-sync rls-async ratelimit-grpc"
TARGETS=$ALL
while [ $# -gt 0 ]; do
  case "$1" in
    -rounds) ROUNDS=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;; -warmup) WARM=$2; shift 2 ;;
    -conns) CONNS=$2; shift 2 ;; -events) EVENTS=$2; shift 2 ;; -pin) PIN=$2; shift 2 ;;
    -peers) PEERS=$2; shift 2 ;; -targets) TARGETS=$2; shift 2 ;; -out) OUT=$2; shift 2 ;;
    -delay) DELAY=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for t in $TARGETS; do case " $ALL " in *" $t "*) ;; *) echo "bench-edge: unknown target $t (known: $ALL)" >&2; exit 2 ;; esac; done
for b in wrk memcached bc; do
  command -v $b >/dev/null || { echo "bench-edge: needs $b: apt-get install $b" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "bench-edge: needs /usr/bin/time: apt-get install time" >&2; exit 2; }
want() { case " $TARGETS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
drop() { local t out=""; for t in $TARGETS; do [ "$t" = "$1" ] || out+="$t "; done; TARGETS=$out; }
notes=()
note() { echo "bench-edge: $*" >&2; notes+=("$*"); }

SRV="" REST=""
# Servers start on CPU 0 with the rest; each is moved to CPU 1 (all its
# threads) for its own turn only, so that the idle ones (an idle edge's
# timers cost ~1.5 % of a core) never share CPU 1 with the one measured.
if [ "$PIN" = on ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then SRV="env GOMAXPROCS=1 taskset -c 0" REST="taskset -c 0"; fi
to_cpu() { [ -z "$SRV" ] || taskset -a -p -c "$2" "$1" >/dev/null; } # pid cpu
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

# --- binaries -------------------------------------------------------------
go build -o "$tmp/edge" ./cmd/edge
go build -o "$tmp/bare" ./loadtest/bare
go build -o "$tmp/mwbench" ./loadtest/middlewarebench
go build -o "$tmp/rlsload" ./loadtest/rlsload
go build -o "$tmp/rlsbare" ./loadtest/benchrlsbare
have_agg=0
if [ "$EVENTS" = on ] && [ -d cmd/aggregator ] && go build -o "$tmp/aggregator" ./cmd/aggregator 2>/dev/null; then have_agg=1; fi
gobin=$(go env GOPATH)/bin
modver() { go version -m "$1" 2>/dev/null | awk '$1=="mod" { print $3; exit }'; }
rl_bin="" gub_bin="" rl_ver="" gub_ver=""
if [ "$PEERS" != on ]; then
  drop gubernator; drop ratelimit-json; drop ratelimit-grpc
fi
if want ratelimit-json || want ratelimit-grpc; then
  if [ ! -x "$gobin/service_cmd" ]; then
    echo "bench-edge: building envoyproxy/ratelimit (go install github.com/envoyproxy/ratelimit/src/service_cmd@latest)" >&2
    GOFLAGS= go install github.com/envoyproxy/ratelimit/src/service_cmd@latest >"$tmp/rl-build.log" 2>&1 || true
  fi
  if [ -x "$gobin/service_cmd" ]; then rl_bin=$gobin/service_cmd rl_ver=$(modver "$rl_bin")
  else note "envoyproxy/ratelimit could not be built ($(tail -1 "$tmp/rl-build.log")): its rows are skipped"; drop ratelimit-json; drop ratelimit-grpc; fi
fi
if want gubernator; then
  if [ ! -x "$gobin/gubernator" ]; then
    for v in latest "${GUBERNATOR_VERSION:-v2.13.0}"; do
      echo "bench-edge: building gubernator (go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@$v)" >&2
      GOFLAGS= go install "github.com/gubernator-io/gubernator/v2/cmd/gubernator@$v" >"$tmp/gub-build.log" 2>&1 && break
      echo "bench-edge:   $(tail -1 "$tmp/gub-build.log")" >&2
    done
  fi
  if [ -x "$gobin/gubernator" ]; then gub_bin=$gobin/gubernator gub_ver=$(modver "$gub_bin")
  else note "gubernator could not be built ($(tail -1 "$tmp/gub-build.log")): its row is skipped"; drop gubernator; fi
fi
if want redis-async || want redis-sync; then
  if ! command -v redis-server >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bench-edge: installing redis-server with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null || true
  fi
  command -v redis-server >/dev/null || { note "no redis-server (apt-get install redis-server): the Redis rows are skipped"; drop redis-async; drop redis-sync; drop redis-sync-tb; }
fi

# --- servers --------------------------------------------------------------
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 300); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "bench-edge: port $1 never opened" >&2; return 1; }
memc() { local p; p=$(port); $REST memcached -l 127.0.0.1 -p "$p" -U 0 -m 256 -t 1 -u root & pids+=($!); wait_port "$p"; mc=127.0.0.1:$p; }
declare -A pid addr kind path body
shards=()
for i in 1 2 3; do memc; shards+=("$mc"); done
memcache=$(IFS=,; echo "${shards[*]}")
brokers=""
if [ $have_agg = 1 ]; then
  bp=$(port); ap=$(port)
  $REST "$tmp/aggregator" -embedded-broker "127.0.0.1:$bp" -listen "127.0.0.1:$ap" ${AGG_FLAGS:-} 2>"$tmp/agg.log" & pids+=($!)
  wait_port "$bp"; brokers="127.0.0.1:$bp"
fi
# The limits are far above what any key reaches in a run, so that targets
# sharing the memcached shards never refuse one another's keys.
cat > "$tmp/rules.yaml" <<RULES
rules:
  - name: async
    path_prefix: /async
    key: ["header:X-API-Key"]
    limit: 100000000
    window: 1m
  - name: sync
    path_prefix: /sync
    key: ["header:X-API-Key"]
    limit: 100000000
    window: 1m
    mode: sync
  - name: sync-tb
    path_prefix: /tb
    key: ["header:X-API-Key"]
    limit: 100000000
    window: 1m
    algorithm: token_bucket
    mode: sync
  - name: blocked
    path_prefix: /blocked
    key: ["header:X-API-Key"]
    limit: 10
    window: 1m
RULES
rlsconf='domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100000000}'
mkdir -p "$tmp/rls-sync" "$tmp/rls-async" "$tmp/rl/ratelimit/config"
echo "$rlsconf" > "$tmp/rls-sync/bench.yaml"
printf 'poplimit: {mode: async}\n%s\n' "$rlsconf" > "$tmp/rls-async/bench.yaml"
echo "$rlsconf" > "$tmp/rl/ratelimit/config/bench.yaml"
ev=(); [ -n "$brokers" ] && ev=(-brokers "$brokers")
edges=() edge_id=0
start_edge() { # name store-flags... → an edge serving HTTP on addr[name]
  local n=$1 p a; shift; p=$(port); a=$(port); edge_id=$((edge_id + 1))
  $SRV "$tmp/edge" -listen "127.0.0.1:$p" -admin "127.0.0.1:$a" -edge-id $edge_id -log-level warn "${ev[@]}" "$@" 2>"$tmp/$n.log" & pids+=($!)
  pid[$n]=$! addr[$n]=127.0.0.1:$p; edges+=("$n 127.0.0.1:$a"); wait_port "$p"
}
http_target() { # target server path [kind body]
  addr[$1]=${addr[$2]} pid[$1]=${pid[$2]} path[$1]=$3 kind[$1]=${4:-get} body[$1]=${5:-}
}

if want bare; then
  p=$(port); $SRV "$tmp/bare" -listen "127.0.0.1:$p" & pids+=($!)
  pid[bare]=$! addr[bare]=127.0.0.1:$p path[bare]=/ kind[bare]=get body[bare]=""; wait_port "$p"
fi
if want async || want sync || want sync-tb || want blocked; then
  start_edge edge -rules "$tmp/rules.yaml" -memcache "$memcache"
  http_target async edge /async/x; http_target sync edge /sync/x; http_target blocked edge /blocked/x
  http_target sync-tb edge /tb/x
fi
if want redis-async || want redis-sync || want redis-sync-tb; then
  rp=$(port)
  $REST redis-server --bind 127.0.0.1 --port "$rp" --save "" --appendonly no --daemonize no --loglevel warning >"$tmp/redis.log" 2>&1 & pids+=($!)
  wait_port "$rp"
  start_edge edge-redis -rules "$tmp/rules.yaml" -redis "127.0.0.1:$rp"
  http_target redis-async edge-redis /async/x; http_target redis-sync edge-redis /sync/x
  http_target redis-sync-tb edge-redis /tb/x
fi
for k in nethttp-bare nethttp fasthttp-bare fasthttp; do
  want $k || continue
  p=$(port); edge_id=$((edge_id + 1))
  $SRV "$tmp/mwbench" -kind $k -listen "127.0.0.1:$p" -rules "$tmp/rules.yaml" -memcache "$memcache" -edge-id $edge_id \
    ${brokers:+-brokers "$brokers"} 2>"$tmp/$k.log" & pids+=($!)
  pid[mw-$k]=$! addr[mw-$k]=127.0.0.1:$p; wait_port "$p"; http_target $k mw-$k /async/x
done
if want gubernator; then
  gh=$(port) gg=$(port) gm=$(port)
  # One node: memberlist on loopback with itself as the only known node.
  gub_env=(GUBER_HTTP_ADDRESS=127.0.0.1:$gh GUBER_GRPC_ADDRESS=127.0.0.1:$gg GUBER_ADVERTISE_ADDRESS=127.0.0.1:$gg
    GUBER_MEMBERLIST_ADDRESS=127.0.0.1:$gm GUBER_MEMBERLIST_BIND_ADDRESS=127.0.0.1:$gm GUBER_MEMBERLIST_KNOWN_NODES=127.0.0.1:$gm
    GUBER_LOG_LEVEL=warn OTEL_TRACES_EXPORTER=none)
  env "${gub_env[@]}" $SRV "$gub_bin" >"$tmp/gubernator.log" 2>&1 & pids+=($!)
  pid[gubernator]=$! addr[gubernator]=127.0.0.1:$gh; wait_port "$gh"
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$gh/v1/HealthCheck" | grep -q '"peer_count":1' && break; sleep 0.1; done
  http_target gubernator gubernator /v1/GetRateLimits post gubernator
fi
if want ratelimit-json || want ratelimit-grpc; then
  memc; rh=$(port) rg=$(port)
  rl_env=(RUNTIME_ROOT="$tmp/rl" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true
    USE_STATSD=false LOG_LEVEL=warn BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="$mc"
    HOST=127.0.0.1 PORT="$rh" GRPC_HOST=127.0.0.1 GRPC_PORT="$rg" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(port)")
  env "${rl_env[@]}" $SRV "$rl_bin" >"$tmp/ratelimit.log" 2>&1 & pids+=($!)
  pid[ratelimit]=$! addr[ratelimit]=127.0.0.1:$rh; wait_port "$rg"; wait_port "$rh"
  http_target ratelimit-json ratelimit /json post ratelimit
  pid[ratelimit-grpc]=${pid[ratelimit]} addr[ratelimit-grpc]=127.0.0.1:$rg kind[ratelimit-grpc]=grpc
fi
if want rls-bare; then
  g=$(port); $SRV "$tmp/rlsbare" -listen "127.0.0.1:$g" & pids+=($!)
  pid[rls-bare]=$! addr[rls-bare]=127.0.0.1:$g kind[rls-bare]=grpc; wait_port "$g"
fi
for m in sync async; do
  want rls-$m || continue
  memc; g=$(port)
  start_edge edge-rls-$m -rules "$tmp/rls-$m" -rls-listen "127.0.0.1:$g" -memcache "$mc"
  wait_port "$g"; pid[rls-$m]=${pid[edge-rls-$m]} addr[rls-$m]=127.0.0.1:$g kind[rls-$m]=grpc
done

# --- load -----------------------------------------------------------------
HZ=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
total_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
load() { # target seconds conns → "rps p50_us p99_us errors requests" (the generator's CPU in $tmp/gencpu)
  local t=$1 d=$2 c=$3
  if [ "${kind[$t]}" = grpc ]; then
    /usr/bin/time -f "%U %S %w" -o "$tmp/gencpu" $REST "$tmp/rlsload" -target "${addr[$t]}" -duration "${d}s" 2>>"$tmp/rlsload.log" |
      awk -v d="$d" '{ printf "%.0f %.0f %.0f %d %.0f\n", $1, $2, $3, $4, $1 * d }'
    return
  fi
  local script=loadtest/wrk/zipf.lua
  [ "${kind[$t]}" = post ] && script=loadtest/benchwrk/post.lua
  WRK_PATH=${path[$t]} WRK_BODY=${body[$t]} WRK_LIMIT=100000000 WRK_DELAY_MS=$DELAY /usr/bin/time -f "%U %S %w" -o "$tmp/gencpu" \
    $REST wrk -t1 -c"$c" -d"${d}s" --latency -s "$script" "http://${addr[$t]}" 2>&1 | awk '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return v*1000; if (v ~ /s$/) return v*1000000; return v }
    /Requests\/sec/ { rps=$2 } / 50%/ { p50=us($2) } / 99%/ { p99=us($2) } /Non-2xx/ { n+=$5 } /requests in/ { reqs=$1 }
    /Socket errors/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 }
    END { printf "%.0f %.0f %.0f %d %.0f\n", rps, p50, p99, n, reqs }'
}
# Rows: target, the bare server its CPU per request is read against, the
# ratelimit peer of its protocol, whether gubernator's row compares, what it is.
cat > "$tmp/rows" <<'ROWS'
bare	-	ratelimit-json	gubernator	fasthttp answering 200 (loadtest/bare)
async	bare	ratelimit-json	gubernator	edge, async rule, 3 memcached shards
sync	bare	ratelimit-json	gubernator	edge, sync rule (a memcached round trip each)
sync-tb	sync	ratelimit-json	gubernator	edge, sync token bucket (memcached gets + cas each); CPU ratio to sync
blocked	bare	ratelimit-json	gubernator	edge, blocked keys (block cache, 429)
redis-async	bare	ratelimit-json	gubernator	edge, Redis store, async rule
redis-sync	bare	ratelimit-json	gubernator	edge, Redis store, sync rule
redis-sync-tb	redis-sync	ratelimit-json	gubernator	edge, Redis store, sync token bucket (one script call each); CPU ratio to redis-sync
nethttp-bare	bare	ratelimit-json	gubernator	net/http answering "ok" (loadtest/middlewarebench)
nethttp	nethttp-bare	ratelimit-json	gubernator	middleware.New, async rule, 3 memcached shards
fasthttp-bare	bare	ratelimit-json	gubernator	fasthttp answering "ok" (loadtest/middlewarebench)
fasthttp	fasthttp-bare	ratelimit-json	gubernator	fasthttpmw.New, async rule, 3 memcached shards
gubernator	bare	ratelimit-json	gubernator	gubernator, one node, HTTP /v1/GetRateLimits
ratelimit-json	bare	ratelimit-json	gubernator	envoyproxy/ratelimit, memcache, HTTP /json
rls-bare	bare	ratelimit-grpc	-	gRPC: grpc-go answering OK (loadtest/benchrlsbare)
rls-sync	rls-bare	ratelimit-grpc	-	gRPC: edge -rls-listen, sync (1 memcached)
rls-async	rls-bare	ratelimit-grpc	-	gRPC: edge -rls-listen, async (1 memcached)
ratelimit-grpc	rls-bare	ratelimit-grpc	-	gRPC: envoyproxy/ratelimit, memcache (1 memcached)
ROWS

echo "bench-edge: $ROUNDS rounds of ${DUR}s (warm-up ${WARM}s a target), wrk -t1 -c$CONNS over 10,000 Zipf(1.1) keys; rlsload 4×16 over 10,000 values" >&2
echo "bench-edge: events: $([ -n "$brokers" ] && echo "every poplimit edge to the embedded broker" || echo off); pinning: $([ -n "$SRV" ] && echo "server under test alone on CPU 1 for its turn (GOMAXPROCS=1), idle servers and the rest on CPU 0" || echo off)" >&2
echo "bench-edge: targets: $TARGETS" >&2
if [ "$WARM" != 0 ]; then for t in $TARGETS; do to_cpu "${pid[$t]}" 1; load "$t" "$WARM" "$CONNS" >/dev/null; to_cpu "${pid[$t]}" 0; done; fi
# Each round runs every target once, and a turn of a target's reference
# (its bare server: the rows file) right before and right after it, so
# that a ratio to the reference compares turns seconds apart rather than
# minutes: this machine's cost per system call moves between spells of
# minutes, which moved ratios of turns far apart by half. A reference turn
# serves both neighbours (bare async bare sync bare ...), and counts in the
# reference's own row too.
ref_of() { awk -F'\t' -v t="$1" '$1 == t { print $2; exit }' "$tmp/rows"; }
declare -A refof
for t in $TARGETS; do r=$(ref_of "$t"); if [ -n "$r" ] && [ "$r" != - ] && want "$r"; then refof[$t]=$r; else refof[$t]=""; fi; done
seq_round() { # the turns of one round, in order
  local t r last="" out=""
  for t in $TARGETS; do
    r=${refof[$t]}
    if [ -n "$r" ] && [ "$last" != "$r" ]; then out+="$r "; fi
    if [ "$last" != "$t" ] || [ -n "$r" ]; then out+="$t "; fi
    last=$t
    if [ -n "$r" ]; then out+="$r "; last=$r; fi
  done
  echo "$out"
}
echo "bench-edge: turns a round: $(seq_round)" >&2
# Per turn: the generator's, the server's and everything else's CPU in
# cores over the run (what limited it).
printf "%-5s %-15s %9s %8s %8s %7s %5s %5s %5s %9s %6s\n" round target req/s p50_us p99_us errors gen srv rest cpu/req_us waits >&2
turn=0
for r in $(seq "$ROUNDS"); do
  for t in $(seq_round); do
    turn=$((turn + 1))
    to_cpu "${pid[$t]}" 1; sleep 0.2
    s0=$(cpu_ticks "${pid[$t]}"); a0=$(total_ticks); start=$(date +%s.%N)
    read -r rps p50 p99 errs reqs < <(load "$t" "$DUR" "$CONNS") || true
    rps=${rps:-0} p50=${p50:-0} p99=${p99:-0} errs=${errs:-0} reqs=${reqs:-0}
    secs=$(echo "$(date +%s.%N) - $start" | bc -l)
    s1=$(cpu_ticks "${pid[$t]}"); a1=$(total_ticks)
    to_cpu "${pid[$t]}" 0
    gcpu=$(awk -v d="$secs" '{ printf "%.2f", ($1 + $2) / d }' "$tmp/gencpu")
    # The generator's voluntary context switches a request: for wrk, how
    # often it slept waiting for answers. Each sleep is a wake-up done in
    # the server's next write (of a thread on the other CPU), so a closed
    # loop that falls into waiting makes a server dearer per request than
    # its own work does. For rlsload (Go) they also count its threads
    # parking between bursts of work, so read them only against each other.
    waits=$(awk -v n="$reqs" '{ printf "%.3f", (n > 0 ? $3 / n : 0) }' "$tmp/gencpu")
    scpu=$(echo "($s1 - $s0) / $HZ / $secs" | bc -l)
    rest=$(echo "($a1 - $a0) / $HZ / $secs - $scpu - $gcpu" | bc -l)
    cpr=0; [ "${reqs:-0}" != 0 ] && cpr=$(echo "($s1 - $s0) / $HZ / $reqs * 1000000" | bc -l)
    printf "%-5s %-15s %9s %8s %8s %7s %5.2f %5.2f %5.2f %9.2f %6s\n" "$r" "$t" "$rps" "$p50" "$p99" "$errs" "$gcpu" "$scpu" "$rest" "$cpr" "$waits" >&2
    echo "$turn $r $t $rps $p50 $p99 $errs $cpr $waits" >> "$tmp/results"
  done
done
# Unloaded latency: one connection, one request at a time.
lat=""
for t in bare async; do
  want $t || continue
  to_cpu "${pid[$t]}" 1; sleep 0.2
  read -r _ l50 l99 _ _ < <(load "$t" "$DUR" 1) || true; lat+=" $t $l50/$l99"
  to_cpu "${pid[$t]}" 0
done

# --- report ---------------------------------------------------------------
{
  echo "### The edge's cost per request (scripts/bench-edge.sh)"
  echo
  echo "$(date -u +%Y-%m-%d), $ROUNDS round(s) of ${DUR}s a turn, targets alternated, each between turns of its ref; $(nproc) CPUs; pinning: $([ -n "$SRV" ] && echo "server under test alone on CPU 1 for its turn (GOMAXPROCS=1); the load generator, stores, broker and idle servers on CPU 0" || echo off); decision events: $([ -n "$brokers" ] && echo "every poplimit edge to the aggregator's embedded broker" || echo off)."
  echo "HTTP: wrk -t1 -c$CONNS, 10,000 keys by Zipf(1.1)$([ "$DELAY" != 0 ] && echo ", each connection waiting ${DELAY} ms after a response (paced, not a closed loop)"); gRPC: loadtest/rlsload, 4 connections × 16 callers, 10,000 values."
  echo "Cells: median of the turns (min–max). A ratio to the ref is taken per turn, against the mean of the ref's turns right before and after it, then its median; a ratio to a peer per round, of the two targets' mean req/s in it. CPU/req: user+sys CPU of the server's process ÷ requests answered. Client waits/req: the load generator's voluntary context switches ÷ requests; for wrk, how often it slept for want of answers, each wake-up done in the server's next write, so turns that wait often cost the server more than its own work (for the gRPC rows rlsload's Go threads parking too: compare them only with each other)."
  echo
  awk -v order="$TARGETS" '
    FILENAME ~ /rows$/ { split($0, f, "\t"); ref[f[1]]=f[2]; rlp[f[1]]=f[3]; gp[f[1]]=f[4]; desc[f[1]]=f[5]; next }
    { i=$1; nturns=i; tgt[i]=$3; rps[i]=$4; p50[i]=$5; p99[i]=$6; err[i]=$7; cpr[i]=$8; wpr[i]=$9; ran[$3]=1
      rsum[$2,$3]+=$4; rcnt[$2,$3]++; rounds[$2]=1 }
    function sort(a, n,   i, j, x) { for (i=1;i<=n;i++) for (j=i+1;j<=n;j++) if (a[j]<a[i]) { x=a[i]; a[i]=a[j]; a[j]=x } }
    function cell(a, n, fmt,   m) {
      if (n == 0) return "–"
      sort(a, n); m = (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
      if (n == 1) return sprintf(fmt, m)
      return sprintf(fmt " (" fmt "–" fmt ")", m, a[1], a[n])
    }
    function comma(x,   s, o) { s = sprintf("%.0f", x); o = ""; while (length(s) > 3) { o = "," substr(s, length(s)-2) o; s = substr(s, 1, length(s)-3) } return s o }
    function val(kind, i) { return kind == "cpu" ? cpr[i] : kind == "p99" ? p99[i] : rps[i] }
    # per turn of t: its value over the mean of the ref turns beside it
    function beside(t, other, kind,   i, n, m, s, v) {
      if (other == "-" || other == "" || !(other in ran) || other == t) return "–"
      n = 0
      for (i = 1; i <= nturns; i++) {
        if (tgt[i] != t) continue
        m = 0; s = 0
        if ((i-1) in tgt && tgt[i-1] == other && val(kind, i-1) > 0) { m++; s += val(kind, i-1) }
        if ((i+1) in tgt && tgt[i+1] == other && val(kind, i+1) > 0) { m++; s += val(kind, i+1) }
        if (m > 0) v[++n] = val(kind, i) / (s / m)
      }
      return cell(v, n, "%.2f")
    }
    # per round: the mean req/s of t over the mean req/s of other
    function peer(t, other,   r, n, v) {
      if (other == "-" || other == "" || !(other in ran) || other == t) return "–"
      n = 0
      for (r in rounds) if (rcnt[r,t] > 0 && rcnt[r,other] > 0 && rsum[r,other] > 0)
        v[++n] = (rsum[r,t] / rcnt[r,t]) / (rsum[r,other] / rcnt[r,other])
      return cell(v, n, "%.2f")
    }
    END {
      print "| target | what | turns | req/s | p50 µs | p99 µs | CPU/req µs | CPU/req ÷ ref (ref) | p99 ÷ ref | req/s ÷ ref | req/s ÷ gubernator | req/s ÷ ratelimit | client waits/req | errors |"
      print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
      nt = split(order, ts, " ")
      for (k=1; k<=nt; k++) {
        t = ts[k]; if (!(t in ran)) continue
        n = 0; e = 0; delete a; delete b; delete c; delete d; delete w
        for (i = 1; i <= nturns; i++) if (tgt[i] == t) { n++; a[n]=rps[i]; b[n]=p50[i]; c[n]=p99[i]; d[n]=cpr[i]; w[n]=wpr[i]; e += err[i] }
        sort(a, n); rs = comma(n % 2 ? a[(n+1)/2] : (a[n/2]+a[n/2+1])/2); if (n > 1) rs = rs " (" comma(a[1]) "–" comma(a[n]) ")"
        cr = beside(t, ref[t], "cpu"); if (cr != "–") cr = cr " (" ref[t] ")"
        printf "| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", t, desc[t], n, rs, cell(b, n, "%.0f"), cell(c, n, "%.0f"), cell(d, n, "%.2f"), cr, beside(t, ref[t], "p99"), beside(t, ref[t], "rps"), peer(t, gp[t]), peer(t, rlp[t]), cell(w, n, "%.3f"), e
      }
    }' "$tmp/rows" "$tmp/results"
  echo
  echo "ref: the bare server the row is read against (its own, for the middleware and gRPC rows). errors: non-2xx answers and socket errors (wrk; blocked is 429 by design), failed calls (rlsload). req/s ÷ ratelimit: ÷ ratelimit-json for HTTP rows, ÷ ratelimit-grpc for gRPC rows."
  [ -n "$lat" ] && echo "Unloaded latency, one connection (p50/p99 µs):$lat."
  echo
  echo "Settings:"
  echo "- poplimit: cmd/edge decision mode, -log-level warn, rules: async and sync 100,000,000 a minute per X-API-Key, blocked 10 a minute; the middleware over edge.Build with the same rules and shards."
  if want gubernator; then
    echo "- gubernator $gub_ver (go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@$gub_ver), one node: GUBER_HTTP_ADDRESS/GUBER_GRPC_ADDRESS on loopback, memberlist on loopback with itself as the only known node, GUBER_LOG_LEVEL=warn, OTEL_TRACES_EXPORTER=none, all else its defaults (cache 50,000, workers = GOMAXPROCS, batching behaviour); each request one token bucket check (algorithm 0), limit 100,000,000 per 60,000 ms; its HTTP API is grpc-gateway over its own gRPC listener."
  fi
  if want ratelimit-json || want ratelimit-grpc; then
    echo "- envoyproxy/ratelimit $rl_ver (go install github.com/envoyproxy/ratelimit/src/service_cmd@latest): BACKEND_TYPE=memcache (one memcached), USE_STATSD=false, LOG_LEVEL=warn, RUNTIME_WATCH_ROOT=false, all else its defaults; domain bench, descriptor user 100,000,000 a minute."
  fi
  for n in "${notes[@]}"; do echo "- skipped: $n"; done
  if [ ${#edges[@]} -gt 0 ] && [ -n "$brokers" ]; then
    for e in "${edges[@]}"; do
      read -r n a <<<"$e"
      echo "- decision events of $n: $(curl -s "http://$a/metrics" | awk '/^poplimit_pipeline_events_(emitted|dropped)_total/ { n = $1; sub(/^poplimit_pipeline_events_/, "", n); sub(/_total.*/, "", n); s[n] += $2 }
        END { printf "%.0f emitted, %.0f dropped", s["emitted"], s["dropped"] }')"
    done
  fi
} > "$tmp/report.md"
cat "$tmp/report.md"
[ -n "$OUT" ] && cp "$tmp/report.md" "$OUT" && echo "bench-edge: table written to $OUT" >&2
exit 0
