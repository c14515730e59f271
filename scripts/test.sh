#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine with Go.
#
# It installs what the tests start for real (memcached, nutcracker,
# prometheus for promtool and the consoles, redis-server, the proxies
# caddy, nginx and haproxy, and chromium for the tests that open the HTML
# pages in a browser) with apt when run as root and they are missing;
# otherwise it names exactly what to install and stops. Then it vets the code and runs every package's tests
# with the race detector. Extra arguments go to `go test` (e.g. -run Edge).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v memcached >/dev/null 2>&1 || need+=(memcached)
command -v nutcracker >/dev/null 2>&1 || [ -x /usr/sbin/nutcracker ] || need+=(nutcracker)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v caddy >/dev/null 2>&1 || need+=(caddy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v chromium >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]}; install them with:" >&2
    echo "  sudo apt-get install ${need[*]}" >&2
    exit 2
  fi
fi
# The packages install services that may start on their default ports; the
# tests start their own on free ports and do not need them.
command -v go >/dev/null 2>&1 || { echo "test.sh: Go is not on PATH (https://go.dev/doc/install)" >&2; exit 2; }

echo "test.sh: go vet ./..."
go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "test.sh: gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
# The fault suite starts whole PoPs and measures them; it runs after the
# other packages, alone, so that neither starves the other's timings.
pkgs=$(go list ./... | grep -v '/faults$')
echo "test.sh: go test -race (every package but faults)"
go test -race -count=1 -timeout 12m "$@" $pkgs
if [ -d faults ]; then
  echo "test.sh: go test -race ./faults (short versions; scripts/faults-full.sh runs the full ones)"
  go test -race -count=1 -timeout 20m "$@" ./faults
fi
# The race detector makes sync.Pool drop items at random, so the tests that
# prove the request path allocates nothing run again without it.
echo "test.sh: allocation tests without -race"
go test -count=1 -run 'Alloc' ./...
# Two processes waiting on one key through memcached are admitted at the
# limit's rate within 2 %: the race detector slows their wake-ups past
# that, so the rate's floor is checked here, without it.
echo "test.sh: the fleet-wide wait's rate without -race"
go test -count=1 -run 'TestWaitFleetHoldsTheLimit' ./decision
