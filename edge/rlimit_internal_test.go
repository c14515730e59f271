//go:build unix

package edge

import (
	"bytes"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/poplimit/poplimit/httpedge"
)

// RaiseFileLimit lifts the soft open-file limit to the hard one and logs
// it; the log warns when the limit is below what Concurrency needs.
func TestRaiseFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Max < 2 {
		t.Skipf("hard open-file limit %d", orig.Max)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	lowered := orig
	lowered.Cur = orig.Max - 1
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Skipf("cannot lower the soft open-file limit: %v", err)
	}
	for _, tc := range []struct {
		name        string
		concurrency int
		warn        bool
	}{
		{"a limit above what Concurrency needs", int(min(orig.Max/2, 1<<20)), false},
		{"a limit below it", int(min(orig.Max, 1<<40)) + 1, true},
	} {
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered)
		var log bytes.Buffer
		var o Options
		o.Server.Concurrency = tc.concurrency
		lim, err := RaiseFileLimit(o, slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var now syscall.Rlimit
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now)
		if now.Cur != orig.Max || lim.Soft != uint64(orig.Max) || lim.Hard != uint64(orig.Max) {
			t.Errorf("%s: soft limit %d (reported %+v), want raised to the hard limit %d", tc.name, now.Cur, lim, orig.Max)
		}
		if warned := strings.Contains(log.String(), "level=WARN"); warned != tc.warn || !strings.Contains(log.String(), "open_files=") {
			t.Errorf("%s (Concurrency %d, limit %d): logged %q, want a warning: %v", tc.name, tc.concurrency, orig.Max, log.String(), tc.warn)
		}
	}
}

// The default traffic connection cap is the open-file limit less what
// the edge holds besides (the reserve, the admin listener's connections,
// the upstream pools), at least half the limit, at most Concurrency.
func TestConnsFor(t *testing.T) {
	proxy := Options{}
	proxy.Server.Mode, proxy.Server.Upstream = httpedge.Proxy, "127.0.0.1:1,127.0.0.1:2"
	admin := Options{AdminMaxConns: 100}
	small := Options{}
	small.Server.Concurrency = 1000
	for _, tc := range []struct {
		name string
		o    Options
		soft uint64
		want int
	}{
		{"the probe's 20,000 descriptors", Options{}, 20000, 20000 - filesReserve - 64},
		{"1,024 descriptors", Options{}, 1024, 1024 - filesReserve - 64},
		{"128 descriptors: half", Options{}, 128, 64},
		{"an unknown limit: Concurrency", Options{}, 0, 65536},
		{"a limit above Concurrency", Options{}, 1 << 20, 65536},
		{"Concurrency 1,000", small, 20000, 1000},
		{"proxy mode, two pools of 512", proxy, 20000, 20000 - filesReserve - 64 - 1024},
		{"AdminMaxConns 100", admin, 1024, 1024 - filesReserve - 100},
	} {
		if got := tc.o.ConnsFor(tc.soft); got != tc.want {
			t.Errorf("%s: ConnsFor(%d) = %d, want %d", tc.name, tc.soft, got, tc.want)
		}
	}
}
