package aggregator

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/internal/testenv"
)

// TestGlobalKeyFileRefused: a key file shorter than 32 bytes, or one that
// cannot be read, stops the aggregator at start with an error naming the
// flag; without one, it starts and warns that production needs it.
func TestGlobalKeyFileRefused(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, []byte(strings.Repeat("k", 31)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{short, filepath.Join(t.TempDir(), "missing")} {
		cfg := testConfig(t)
		cfg.GlobalInterval, cfg.GlobalKeyFile = global.DefaultInterval, path
		a, err := Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
		if err == nil {
			stopAggregator(t, a)
			t.Errorf("key file %s: started, want an error", path)
			continue
		}
		if !strings.Contains(err.Error(), "-global-key-file") {
			t.Errorf("key file %s: error %q does not name -global-key-file", path, err)
		}
	}
	var out testenv.LockedBuffer
	cfg := testConfig(t)
	cfg.GlobalInterval = global.DefaultInterval
	a, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(&out, nil)))
	if err != nil {
		t.Fatal(err)
	}
	stopAggregator(t, a)
	if !strings.Contains(out.String(), "production needs -global-key-file") {
		t.Errorf("started without -global-key-file and no warning:\n%s", out.String())
	}
}
