package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/poplimit/poplimit/store"
)

// TestConcurrentUseAndClose runs counters, buckets and logs from many
// goroutines at once over one Store, closes it while they run, and checks
// that every op either succeeded or failed with ErrClosed or
// ErrUnavailable, with no race (under -race) and no panic.
func TestConcurrentUseAndClose(t *testing.T) {
	p := startRedis(t)
	s, err := New(Config{Addrs: []string{p.Addr}, Timeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch (g + i) % 3 {
				case 0:
					ops := []store.Op{{Key: uint64(g), Start: 1, Delta: 1, TTL: time.Minute}, {Key: uint64(g), Start: 0}}
					s.Do(ctx, ops)
					err = errors.Join(ops[0].Err, ops[1].Err)
				case 1:
					_, err = s.GCRA(ctx, uint64(g), GCRAParams{Rate: 100, Per: time.Second, Capacity: 10}, time.Now().UnixNano(), 1, true)
				default:
					_, err = s.SlidingLog(ctx, uint64(g), SlidingLogParams{Limit: 10, Window: time.Second}, time.Now().UnixNano(), 1, true)
				}
				if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUnavailable) {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("op during use and Close: %v", err)
	}
	ops := []store.Op{{Key: 1, Start: 1, Delta: 1}}
	s.Do(ctx, ops)
	if !errors.Is(ops[0].Err, ErrClosed) {
		t.Errorf("Do after Close: got %v, want ErrClosed", ops[0].Err)
	}
}
