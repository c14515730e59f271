package edge

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAdminAnswersDuringReload: while a reload is in progress (held
// between swapping the rules in and finishing, with the reload lock), the
// admin listener answers /metrics, /healthz and /readyz: nothing it serves
// waits on a reload.
func TestAdminAnswersDuringReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(path, []byte("rules: [{name: a, limit: 1, window: 1m}]\n"), 0o644)
	e, err := Build(Options{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", RulesFile: path, ReloadPoll: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	e.reload.applying = func() { close(entered); <-release }
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.Serve(ctx) }()
	defer func() { cancel(); <-served }()

	os.WriteFile(path, []byte("rules: [{name: b, limit: 2, window: 1m}]\n"), 0o644)
	reloaded := make(chan error, 1)
	go func() { reloaded <- e.Reload() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the reload did not start within 10 s")
	}
	c := &http.Client{Timeout: 5 * time.Second}
	for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
		resp, err := c.Get("http://" + e.AdminAddr() + p)
		if err != nil {
			t.Errorf("admin %s during a reload: %v", p, err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("admin %s during a reload: %d", p, resp.StatusCode)
		}
	}
	close(release)
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if e.Rules().Lookup("b") == nil {
		t.Error("the reload did not apply")
	}
}
