#!/usr/bin/env bash
# Measures what asking poplimit costs behind a proxy (deploy/proxies/README.md):
# requests/s through Caddy and through nginx with poplimit deciding every
# request (the configurations of deploy/proxies, fail closed; poplimit in
# decision mode with its in-memory store and one rule no client reaches), as
# a ratio to the same proxy forwarding straight to the same origin
# (loadtest/bare), in the same run. A third configuration, the same proxy
# configuration asking a server that allows everything (loadtest/bare again)
# instead of poplimit, splits the cost into the extra hop and poplimit's own
# work. The six targets alternate, R rounds, one wrk at a time on loopback,
# each run bounded by -duration.
#
# usage: scripts/bench-proxies.sh [-rounds R] [-duration S] [-conns C]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 DUR=5 CONNS=32
while [ $# -gt 0 ]; do
  case "$1" in
    -rounds) ROUNDS=$2; shift 2 ;; -duration) DUR=$2; shift 2 ;;
    -conns) CONNS=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
find_bin() { command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || true; }
WRK=$(find_bin wrk) CADDY=$(find_bin caddy) NGINX=$(find_bin nginx)
need() { echo "bench-proxies: needs $1: apt-get install $1" >&2; exit 2; }
[ -n "$WRK" ] || need wrk
[ -n "$CADDY" ] || need caddy
[ -n "$NGINX" ] || need nginx
command -v python3 >/dev/null || { echo "bench-proxies: needs python3 (free ports)" >&2; exit 2; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

go build -o "$tmp/edge" ./cmd/edge
go build -o "$tmp/bare" ./loadtest/bare

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

origin=$(port) allow=$(port)
"$tmp/bare" -listen "127.0.0.1:$origin" & pids+=($!)
"$tmp/bare" -listen "127.0.0.1:$allow" & pids+=($!)
cat > "$tmp/rules.yaml" <<'RULES'
rules:
  - name: bench
    limit: 4000000000
    window: 1m
RULES
edge=$(port) admin=$(port)
"$tmp/edge" -listen "127.0.0.1:$edge" -admin "127.0.0.1:$admin" -rules "$tmp/rules.yaml" \
  -trusted-proxies 127.0.0.1/32 -log-level warn & pids+=($!)
wait_port "$origin"; wait_port "$allow"; wait_port "$edge"

# Caddy: the shipped Caddyfile asking poplimit, the same asking the allow-all
# server, and a plain reverse proxy.
caddy_pl=$(port) caddy_hop=$(port) caddy_plain=$(port)
mkdir -p "$tmp/caddy/config" "$tmp/caddy/data"
cat > "$tmp/Caddyfile.plain" <<EOF
{
	admin off
}
http://:$caddy_plain {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:$origin
}
EOF
caddy_env=(HOME="$tmp/caddy" XDG_CONFIG_HOME="$tmp/caddy/config" XDG_DATA_HOME="$tmp/caddy/data" CADDY_ADMIN=off)
caddy_shipped() { # site-port decision-port
  env "${caddy_env[@]}" POPLIMIT_SITE="http://:$1" POPLIMIT_BIND=127.0.0.1 POPLIMIT_DECISION="127.0.0.1:$2" \
    POPLIMIT_ORIGIN="127.0.0.1:$origin" POPLIMIT_ON_FAILURE=closed POPLIMIT_ALLOW_PORT="$(port)" \
    "$CADDY" run --config deploy/proxies/caddy/Caddyfile --adapter caddyfile >"$tmp/caddy-$1.log" 2>&1 & pids+=($!)
}
caddy_shipped "$caddy_pl" "$edge"
caddy_shipped "$caddy_hop" "$allow"
env "${caddy_env[@]}" "$CADDY" run --config "$tmp/Caddyfile.plain" --adapter caddyfile >"$tmp/caddy-plain.log" 2>&1 & pids+=($!)

# nginx likewise; the same workers for all three.
nginx_pl=$(port) nginx_hop=$(port) nginx_plain=$(port)
nginx_main() { # dir include-file
  mkdir -p "$1"
  cat > "$1/nginx.conf" <<EOF
worker_processes auto;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
    include $2;
}
EOF
}
nginx_shipped() { # listen-port decision-port out-file
  sed -e "s|\${POPLIMIT_LISTEN}|127.0.0.1:$1|; s|\${POPLIMIT_DECISION}|127.0.0.1:$2|; s|\${POPLIMIT_ORIGIN}|127.0.0.1:$origin|; s|\${POPLIMIT_ON_FAILURE}|closed|" \
    deploy/proxies/nginx/poplimit.conf.template > "$3"
}
nginx_shipped "$nginx_pl" "$edge" "$tmp/nginx-poplimit.conf"
nginx_shipped "$nginx_hop" "$allow" "$tmp/nginx-hop.conf"
cat > "$tmp/nginx-plain.conf" <<EOF
upstream plain_origin {
    server 127.0.0.1:$origin;
    keepalive 64;
}
server {
    listen 127.0.0.1:$nginx_plain;
    location / {
        proxy_pass http://plain_origin;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host \$host;
        proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
}
EOF
nginx_main "$tmp/nginx-pl" "$tmp/nginx-poplimit.conf"
nginx_main "$tmp/nginx-hop" "$tmp/nginx-hop.conf"
nginx_main "$tmp/nginx-plain" "$tmp/nginx-plain.conf"
chmod 755 "$tmp"
for d in nginx-pl nginx-hop nginx-plain; do
  "$NGINX" -p "$tmp/$d" -c "$tmp/$d/nginx.conf" -g 'daemon off;' & pids+=($!)
done
for p in "$caddy_pl" "$caddy_hop" "$caddy_plain" "$nginx_pl" "$nginx_hop" "$nginx_plain"; do wait_port "$p"; done

# Each target once, to check it answers as expected before measuring.
for t in "$caddy_pl" "$nginx_pl"; do
  curl -sf -o /dev/null -D "$tmp/h" "http://127.0.0.1:$t/x" || { echo "bench-proxies: 127.0.0.1:$t does not answer 200" >&2; exit 1; }
  grep -qi '^ratelimit:' "$tmp/h" || { echo "bench-proxies: 127.0.0.1:$t answers without poplimit's fields" >&2; exit 1; }
done

run_wrk() { # port → "rps p50_us p99_us non2xx"
  "$WRK" -t1 -c"$CONNS" -d"${DUR}s" --latency "http://127.0.0.1:$1/v1/items" 2>&1 | awk '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return v*1000; if (v ~ /s$/) return v*1000000; return v }
    /Requests\/sec/ { rps=$2 } / 50%/ { p50=us($2) } / 99%/ { p99=us($2) } /Non-2xx/ { n=$5 }
    END { printf "%.0f %.0f %.0f %d\n", rps, p50, p99, n }'
}
echo "bench-proxies: $ROUNDS rounds of ${DUR}s per target, wrk -t1 -c$CONNS, $(nproc) cores; caddy $("$CADDY" version | cut -d' ' -f1), $("$NGINX" -v 2>&1 | sed 's/.*: //')"
printf "%-6s %-15s %10s %9s %9s %7s\n" round target req/s p50_us p99_us non2xx
for r in $(seq "$ROUNDS"); do
  for t in caddy-plain caddy-hop caddy-poplimit nginx-plain nginx-hop nginx-poplimit; do
    case $t in
      caddy-plain) p=$caddy_plain ;; caddy-hop) p=$caddy_hop ;; caddy-poplimit) p=$caddy_pl ;;
      nginx-plain) p=$nginx_plain ;; nginx-hop) p=$nginx_hop ;; nginx-poplimit) p=$nginx_pl ;;
    esac
    read -r rps p50 p99 n <<<"$(run_wrk "$p")"
    printf "%-6s %-15s %10s %9s %9s %7s\n" "$r" "$t" "$rps" "$p50" "$p99" "$n"
    echo "$r $t $rps $n" >> "$tmp/results"
  done
done
awk '
  { rps[$1,$2]=$3; bad+=$4; rounds[$1]=1 }
  END {
    print ""
    print "ratios per round (min / median / max):"
    split("caddy nginx", px, " ")
    split("poplimit:plain hop:plain poplimit:hop", pairs, " ")
    label["poplimit:plain"]="poplimit deciding ÷ no decision      "
    label["hop:plain"]="allow-all decision ÷ no decision    "
    label["poplimit:hop"]="poplimit deciding ÷ allow-all       "
    for (k=1;k<=2;k++) for (q=1;q<=3;q++) {
      split(pairs[q], ab, ":"); c=0
      for (r in rounds) { v[++c]=rps[r,px[k]"-"ab[1]]/rps[r,px[k]"-"ab[2]] }
      for (i=1;i<=c;i++) for (j=i+1;j<=c;j++) if (v[j]<v[i]) { x=v[i]; v[i]=v[j]; v[j]=x }
      printf "  %-6s %s %.3f / %.3f / %.3f\n", px[k], label[pairs[q]], v[1], v[int((c+1)/2)], v[c]
    }
    if (bad > 0) printf "WARNING: %d non-2xx responses\n", bad
  }' "$tmp/results"
echo "edge decisions: $(curl -s "http://127.0.0.1:$admin/metrics" | awk '/^poplimit_edge_requests_total/ { s[$0 ~ /decision="allowed"/ ? "allowed" : "other"] += $NF } END { printf "allowed %d, other %d", s["allowed"], s["other"] }')"
