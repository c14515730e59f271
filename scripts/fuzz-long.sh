#!/usr/bin/env bash
# Runs every fuzz target of the module for a while each (default 60s): the
# long run behind the seeds that `go test` replays in the normal suite.
#   scripts/fuzz-long.sh [-time 60s] [package-pattern]
# A failing input is written under the package's testdata/fuzz/ and the
# script stops there with its output.
set -euo pipefail
cd "$(dirname "$0")/.."
time=60s
if [ "${1:-}" = "-time" ]; then time=$2; shift 2; fi
pattern=${1:-./...}
for pkg in $(go list "$pattern"); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "== $pkg $target ($time)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -parallel 1 "$pkg" 2>&1 | tail -3
  done
done
