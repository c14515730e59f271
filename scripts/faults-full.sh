#!/usr/bin/env bash
# The full versions of the fault, load and bad-input suite (faults/): a 30 s
# partition, a 10-minute soak, a flood of 10 million keys, clock skew over a
# 10 s window, then each of the suite's fuzz targets for $FUZZTIME. About 25
# minutes on a two-core machine. The short versions run in the normal suite
# (scripts/test.sh).
#
# It runs without the race detector, so that the in-process edges are
# measured at their real speed (the soak, the flood and the restarts run the
# binaries, built without it, either way); pass -race to add it. Extra
# arguments go to `go test` (e.g. -run 'Soak|KeyFlood'). The log, with every
# figure the tests print, is kept in $LOG (default: a new file in $TMPDIR);
# the partition's page (each class of client's admitted requests per second
# through each side of the split, drawn) beside it, in $PARTITION_PAGE.
#
#   scripts/faults-full.sh
#   POPLIMIT_SOAK_RATE=3000 scripts/faults-full.sh -run Soak
#   FUZZTIME=5m scripts/faults-full.sh -run '^$'
set -euo pipefail
cd "$(dirname "$0")/.."

for bin in memcached; do
  command -v "$bin" >/dev/null 2>&1 || { echo "faults-full.sh: $bin is missing (apt-get install $bin)" >&2; exit 2; }
done
log=${LOG:-$(mktemp -t poplimit-faults-full.XXXXXX.log)}
fuzztime=${FUZZTIME:-30s}
page=${PARTITION_PAGE:-${log%.log}-partition.html}

echo "faults-full.sh: POPLIMIT_FULL=1 go test -count=1 -v -timeout 90m $* ./faults/  (log: $log)"
POPLIMIT_FULL=1 POPLIMIT_PARTITION_PAGE="$page" go test -count=1 -v -timeout 90m "$@" ./faults/ 2>&1 | tee "$log"

if [ "$fuzztime" != 0 ]; then
  for target in FuzzHostileRequestKey FuzzMemcachedReply; do
    echo "faults-full.sh: go test -run '^\$' -fuzz '^$target\$' -fuzztime $fuzztime ./faults/"
    go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" ./faults/ 2>&1 | tee -a "$log"
  done
fi
echo "faults-full.sh: passed; log in $log"
[ -f "$page" ] && echo "faults-full.sh: the partition drawn: $page"
