package decision_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

func mustRules(t testing.TB, yaml string) *rules.Rules {
	t.Helper()
	rs, err := rules.ParseRules([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// outcomes decides n requests of addr at now and returns their outcomes.
func outcomes(c *decision.Core, addr string, now time.Time, n int) []decision.Outcome {
	var out []decision.Outcome
	for range n {
		req := decision.Request{Host: []byte("example.com"), Method: []byte("GET"), Path: []byte("/"),
			Addr: netip.MustParseAddr(addr), Now: now}
		v := c.Decide(&req)
		out = append(out, v.Outcome)
		c.Finish(v)
	}
	return out
}

// New assembles a whole core over the in-memory store: the limit holds
// per client, each client counted apart, and Close flushes.
func TestNewOverMemStore(t *testing.T) {
	rs := mustRules(t, "rules: [{name: api, limit: 2, window: 1m, mode: sync}]")
	c, err := decision.New(rs, store.NewMemStore(nil), decision.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := []decision.Outcome{decision.Allowed, decision.Allowed, decision.Limited}
	if got := outcomes(c, "192.0.2.1", now, 3); !equalOutcomes(got, want) {
		t.Errorf("client 1: got %v, want %v", got, want)
	}
	if got := outcomes(c, "192.0.2.2", now, 1); got[0] != decision.Allowed {
		t.Errorf("client 2: got %v, want allowed (a key of its own)", got)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// The block cache is optional: a core without one decides every request
// by its limiter.
func TestNewCoreWithoutBlockCache(t *testing.T) {
	lim, err := window.New(window.Config{}, store.NewMemStore(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close(context.Background())
	rs := mustRules(t, "rules: [{name: api, limit: 1, window: 1m, mode: sync}]")
	c, err := decision.NewCore(decision.CoreConfig{}, rs, decision.CoreDeps{Limiter: lim})
	if err != nil {
		t.Fatalf("NewCore without Blocks: %v", err)
	}
	now := time.Now()
	want := []decision.Outcome{decision.Allowed, decision.Limited, decision.Limited}
	if got := outcomes(c, "192.0.2.1", now, 3); !equalOutcomes(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	// The cache is what holds a block for its timeout: without one a rule
	// of action: block is refused, naming the rule.
	block := mustRules(t, "rules: [{name: login, limit: 1, window: 1m, action: block, timeout: 10m}]")
	if err := c.SetRules(block); err == nil || !strings.Contains(err.Error(), `"login"`) || !strings.Contains(err.Error(), "block cache") {
		t.Errorf("SetRules of a block rule without a block cache: got %v, want an error naming the rule and the cache", err)
	}
}

// A core of New holds a block for its timeout, past the window in which
// the client went over.
func TestNewHoldsABlock(t *testing.T) {
	bc, err := blockcache.New(blockcache.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	rs := mustRules(t, "rules: [{name: login, limit: 1, window: 1m, mode: sync, action: block, timeout: 10m}]")
	c, err := decision.New(rs, store.NewMemStore(nil), decision.Options{Blocks: bc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	now := time.Now()
	want := []decision.Outcome{decision.Allowed, decision.Limited}
	if got := outcomes(c, "192.0.2.1", now, 2); !equalOutcomes(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	bc.Wait() // the cache applies its sets asynchronously
	if got := outcomes(c, "192.0.2.1", now.Add(3*time.Minute), 1); got[0] != decision.Limited {
		t.Errorf("three windows later, within the block: got %v, want limited", got)
	}
	if got := outcomes(c, "192.0.2.1", now.Add(11*time.Minute), 1); got[0] != decision.Allowed {
		t.Errorf("after the block: got %v, want allowed", got)
	}
}

func TestNewRefusesNoStore(t *testing.T) {
	rs := mustRules(t, "rules: [{name: api, limit: 2, window: 1m}]")
	if _, err := decision.New(rs, nil, decision.Options{}); err == nil {
		t.Error("New with a nil store: got no error")
	}
}

func equalOutcomes(a, b []decision.Outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
