package shardproxy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCallerContextLabels ends the caller's context while its ops wait on
// a hung shard, in the ways that used to race Do against its workers: the
// caller's deadline at the same time as the shard's Timeout (as the edge
// sets them), the caller's deadline while a worker waits for a connection,
// and the caller's cancel. Whichever goroutine sees the end first, a
// deadline is always result="timeout" and a cancel always
// result="canceled".
func TestCallerContextLabels(t *testing.T) {
	const calls = 12
	tests := []struct {
		name    string
		timeout time.Duration // the Client's
		hold    bool          // another call holds the shard's only connection
		ctx     func() (context.Context, context.CancelFunc)
		result  string
		is      error
	}{
		{"deadline equal to the shard timeout", 60 * time.Millisecond, false, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 60*time.Millisecond)
		}, "timeout", ErrTimeout},
		{"deadline while waiting for a connection", time.Second, true, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 40*time.Millisecond)
		}, "timeout", ErrTimeout},
		{"cancel while waiting for a connection", time.Second, true, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(40*time.Millisecond, cancel)
			return ctx, cancel
		}, "canceled", context.Canceled},
		{"cancel while the shard is hung", time.Second, false, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(40*time.Millisecond, cancel)
			return ctx, cancel
		}, "canceled", context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			cfg := Config{Servers: []Server{{Addr: hungServer(t)}}, Timeout: tt.timeout, FailureLimit: 1000}
			if tt.hold {
				cfg.MaxConnsPerShard = 1
			}
			c, err := New(cfg, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var holder sync.WaitGroup
			defer holder.Wait()
			if tt.hold {
				holder.Go(func() { c.Do(context.Background(), []Op{{Key: 9, Delta: 1}}) }) // holds the connection for Timeout
				time.Sleep(20 * time.Millisecond)
			}
			for range calls {
				ops := []Op{{Key: 1, Delta: 1, TTL: time.Minute}, {Key: 2, Delta: -1}, {Key: 3}}
				ctx, cancel := tt.ctx()
				c.Do(ctx, ops)
				cancel()
				for _, op := range ops {
					if !errors.Is(op.Err, tt.is) {
						t.Errorf("op %+v: got %v, want %v", op, op.Err, tt.is)
					}
				}
			}
			var got, want float64
			for _, k := range kindNames[:kindGet+1] {
				got += testutil.ToFloat64(c.m.opsVec.WithLabelValues(k, tt.result))
			}
			if want = 3 * calls; got != want {
				for _, r := range resultNames {
					for _, k := range kindNames[:kindGet+1] {
						if n := testutil.ToFloat64(c.m.opsVec.WithLabelValues(k, r)); n > 0 {
							t.Logf("ops_total{op=%q,result=%q} %v", k, r, n)
						}
					}
				}
				t.Errorf("ops_total{result=%q}: got %v, want %v (every op of every call)", tt.result, got, want)
			}
		})
	}
}

func TestContextCancel(t *testing.T) {
	const timeout = time.Second
	c := newClient(t, Config{Servers: []Server{{Addr: hungServer(t)}}, Timeout: timeout})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	ops := []Op{{Key: 1, Delta: 1}, {Key: 2}}
	begin := time.Now()
	c.Do(ctx, ops)
	if elapsed := time.Since(begin); elapsed > timeout/2 {
		t.Errorf("Do cancelled after 30ms: took %v, want well under the %v timeout", elapsed, timeout)
	}
	for _, op := range ops {
		if !errors.Is(op.Err, context.Canceled) {
			t.Errorf("op %+v: got %v, want context.Canceled", op, op.Err)
		}
	}
}
