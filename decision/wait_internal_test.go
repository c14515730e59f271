package decision

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/poplimit/poplimit/memcachestore"
	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/shardproxy"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// steppedClock is Wait's time in these tests: it stands still, and a
// Sleep moves it on by exactly the time asked, recording it; before moves
// it on, hook runs (another process acting meanwhile).
type steppedClock struct {
	t      time.Time
	slept  []time.Duration
	before func(until time.Time)
}

func (c *steppedClock) Now() time.Time { return c.t }

func (c *steppedClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.slept = append(c.slept, d)
	if c.before != nil {
		c.before(c.t.Add(d))
	}
	c.t = c.t.Add(d)
	return nil
}

// an hour ahead of the wall clock, so that a context's deadline set from
// it has not passed, 100 ms into a second: a window's start is known.
func newSteppedClock() *steppedClock {
	return &steppedClock{t: time.Now().Add(time.Hour).Truncate(time.Second).Add(100 * time.Millisecond)}
}

// waitCore returns a core deciding by the rules in doc over store, its
// limiter's clock clk, with its metrics in a registry of its own.
func waitCore(t *testing.T, doc string, backend store.Store, clk store.Clock) *Core {
	t.Helper()
	rs, err := rules.ParseRules([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := window.New(window.Config{Clock: clk}, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	blocks, err := blockcache.New(blockcache.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(blocks.Close)
	c, err := NewCore(CoreConfig{}, rs, CoreDeps{Limiter: lim, Blocks: blocks, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A refused waiter sleeps until the exact instant the algorithm gives,
// once, and is admitted then: a sliding window's release, a token
// bucket's theoretical arrival time.
func TestWaitSleepsUntilTheExactRelease(t *testing.T) {
	for _, tt := range []struct {
		name, rule string
		admitted   int // at once
		sleep      time.Duration
	}{
		// 2 in the window at 100 ms: the window's recorded shape places
		// them there, so the third fits when they leave the trailing
		// window, 1 s on.
		{"sliding_window", "{name: r, limit: 2, window: 1s, mode: sync}", 2, time.Second},
		// 10 a second, burst 1: one at once, the next 100 ms on.
		{"token_bucket", "{name: r, limit: 10, window: 1s, burst: 1, algorithm: token_bucket, mode: sync}", 1, 100 * time.Millisecond},
		// A fixed window of 2 a second: the third at the next window's
		// start, 0.9 s on.
		{"fixed_window", "{name: r, limit: 2, window: 1s, algorithm: fixed_window, mode: sync}", 2, 900 * time.Millisecond},
		// A leaky bucket (the meter) leaking 4 a second, capacity 2: two
		// at once, the third once one has leaked, 250 ms on.
		{"leaky_bucket", "{name: r, limit: 4, window: 1s, burst: 2, algorithm: leaky_bucket, mode: sync}", 2, 250 * time.Millisecond},
		// A log of 2 a second: the third when the first leaves, 1 s on.
		{"sliding_log", "{name: r, limit: 2, window: 1s, algorithm: sliding_log}", 2, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newSteppedClock()
			c := waitCore(t, "rules: ["+tt.rule+"]", store.NewMemStore(clk), clk)
			for i := range tt.admitted {
				if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
					t.Fatalf("wait %d: %v", i, err)
				}
			}
			if len(clk.slept) != 0 {
				t.Fatalf("the first %d waits slept %v; they conform at once", tt.admitted, clk.slept)
			}
			start := clk.t
			if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
				t.Fatal(err)
			}
			if len(clk.slept) != 1 || clk.slept[0] != tt.sleep {
				t.Fatalf("slept %v, want exactly [%v]", clk.slept, tt.sleep)
			}
			if got := clk.t.Sub(start); got != tt.sleep {
				t.Fatalf("admitted %v after asking, want %v", got, tt.sleep)
			}
			if n := testutil.ToFloat64(c.wm.result[waitAdmitted]); n != float64(tt.admitted+1) {
				t.Errorf("waits_total{result=admitted} = %v, want %d", n, tt.admitted+1)
			}
		})
	}
}

// A waiter that wakes at its release to find the room taken by another
// process sharing the store is refused again, sleeps until the new
// release, and is counted as a retry.
func TestWaitAsksAgainWhenAnotherProcessTookTheRoom(t *testing.T) {
	const rule = "rules: [{name: r, limit: 1, window: 1s, burst: 1, algorithm: token_bucket, mode: sync}]"
	clk := newSteppedClock()
	backend := store.NewMemStore(clk)
	c := waitCore(t, rule, backend, clk)
	other := waitCore(t, rule, backend, clk)
	if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
		t.Fatal(err)
	}
	took := 0
	clk.before = func(until time.Time) {
		if took == 0 {
			// The other process asks at the same instant, first.
			v := other.DecideKey(other.Current(), until, 0, []byte("k"), 1, 0)
			if v.Outcome == Allowed {
				took++
			}
			other.Finish(v)
		}
	}
	if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
		t.Fatal(err)
	}
	if took != 1 {
		t.Fatal("the other process was not admitted at the release")
	}
	// One a second: 1 at 0.1 s, the next at 1.1 s, the other's; then
	// 2.1 s.
	if want := []time.Duration{time.Second, time.Second}; len(clk.slept) != 2 || clk.slept[0] != want[0] || clk.slept[1] != want[1] {
		t.Fatalf("slept %v, want %v", clk.slept, want)
	}
	if n := testutil.ToFloat64(c.wm.retries); n != 1 {
		t.Errorf("wait_retries_total = %v, want 1", n)
	}
}

// Wait refuses at once, without sleeping, what can never conform, and a
// deadline before the conformance time.
func TestWaitRefusesAtOnce(t *testing.T) {
	clk := newSteppedClock()
	c := waitCore(t, `rules:
  - {name: w, limit: 2, window: 1s, mode: sync}
  - {name: tb, limit: 10, window: 1s, burst: 3, algorithm: token_bucket, mode: sync}
  - {name: q, limit: 10, window: 1s, burst: 2, algorithm: leaky_bucket, action: delay, mode: sync}`,
		store.NewMemStore(clk), clk)
	ctx := context.Background()
	for _, tt := range []struct {
		rule string
		cost uint64
		want error
	}{
		{"nope", 1, ErrUnknownRule},
		{"w", 3, ErrNeverConforms},
		{"tb", 4, ErrNeverConforms}, // over the burst, within the limit
		{"q", 4, ErrNeverConforms},  // over the queue: burst 2 wait while one is served
	} {
		if err := c.wait(ctx, clk, tt.rule, []byte("k"), tt.cost); !errors.Is(err, tt.want) {
			t.Errorf("Wait(%s, cost %d) = %v, want %v", tt.rule, tt.cost, err, tt.want)
		}
	}
	if err := c.wait(ctx, clk, "q", []byte("k"), 3); err != nil {
		t.Errorf("Wait(q, cost 3) = %v: the queue's capacity is its burst and one served", err)
	}
	if err := c.wait(ctx, clk, "w", []byte("k"), 2); err != nil {
		t.Fatal(err)
	}
	// The next unit conforms 1 s on; the deadline is 999 ms on.
	dctx, cancel := context.WithDeadline(ctx, clk.t.Add(999*time.Millisecond))
	defer cancel()
	slept := len(clk.slept)
	err := c.wait(dctx, clk, "w", []byte("k"), 1)
	if !errors.Is(err, ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a deadline before the release = %v, want ErrWouldExceedDeadline", err)
	}
	if len(clk.slept) != slept {
		t.Fatalf("slept %v before refusing", clk.slept[slept:])
	}
	if n := testutil.ToFloat64(c.wm.result[waitDeadline]); n != 1 {
		t.Errorf("waits_total{result=deadline} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(c.wm.result[waitBad]); n != 4 {
		t.Errorf("waits_total{result=never} = %v, want 4", n)
	}
}

// parkedClock is the wall clock's Now, and a Sleep that says it began and
// lasts until its context ends.
type parkedClock struct {
	wallClock
	asleep chan struct{}
}

func (c parkedClock) Sleep(ctx context.Context, d time.Duration) error {
	c.asleep <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// A waiter whose context ends while it sleeps returns its error.
func TestWaitReturnsWhenTheContextEnds(t *testing.T) {
	c := waitCore(t, "rules: [{name: r, limit: 1, window: 1h, mode: sync}]", store.NewMemStore(nil), nil)
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Wait(ctx, "r", []byte("k"), 1); err != nil {
		t.Fatal(err)
	}
	clk := parkedClock{asleep: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- c.wait(ctx, clk, "r", []byte("k"), 1) }()
	select {
	case <-clk.asleep:
	case <-time.After(10 * time.Second):
		t.Fatal("the second Wait did not sleep")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once its context was canceled")
	}
	if n := testutil.ToFloat64(c.wm.result[waitCanceled]); n != 1 {
		t.Errorf("waits_total{result=canceled} = %v, want 1", n)
	}
}

// A queue's waiter takes its place at once and sleeps until it comes,
// spaced Window/Limit apart.
func TestWaitOnAQueueSleepsUntilItsPlace(t *testing.T) {
	clk := newSteppedClock()
	c := waitCore(t, "rules: [{name: q, limit: 10, window: 1s, burst: 2, algorithm: leaky_bucket, action: delay, mode: sync}]",
		store.NewMemStore(clk), clk)
	for range 3 {
		if err := c.wait(context.Background(), clk, "q", []byte("k"), 1); err != nil {
			t.Fatal(err)
		}
	}
	// One served at once, each next one 100 ms after the one before.
	if want := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}; len(clk.slept) != 2 || clk.slept[0] != want[0] || clk.slept[1] != want[1] {
		t.Fatalf("slept %v, want %v", clk.slept, want)
	}
}

// Reserve on a token bucket takes units for later instants, exactly
// spaced, within the delay asked; what it reserved refuses other requests
// until then; past the delay it takes nothing and says when to ask again.
func TestReserveHoldsABucketForLater(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			clk := newSteppedClock()
			c := waitCore(t, "rules: [{name: tb, limit: 10, window: 1s, burst: 1, algorithm: token_bucket, mode: "+mode+"}]",
				store.NewMemStore(clk), clk)
			ctx := context.Background()
			now := clk.t
			for i := range 3 {
				r, err := c.Reserve(ctx, now, "tb", []byte("k"), 1, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if want := now.Add(time.Duration(i) * 100 * time.Millisecond); !r.OK() || !r.TimeToAct().Equal(want) {
					t.Fatalf("reservation %d: OK %v at %v, want at %v", i, r.OK(), r.TimeToAct().Sub(now), want.Sub(now))
				}
				if d := r.DelayFrom(now); d != time.Duration(i)*100*time.Millisecond {
					t.Fatalf("reservation %d: DelayFrom = %v", i, d)
				}
			}
			// The next would act 300 ms on: past a delay of 250 ms. A
			// delay counts in whole units' time (100 ms, 2 units here):
			// it would be taken 100 ms on, acting 200 ms after that.
			r, err := c.Reserve(ctx, now, "tb", []byte("k"), 1, 250*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() || !r.TimeToAct().Equal(now.Add(100*time.Millisecond)) || r.DelayFrom(now) != InfDuration {
				t.Fatalf("past its delay: OK %v, ask again %v on", r.OK(), r.TimeToAct().Sub(now))
			}
			// The reserved units refuse a request until the last of
			// them has conformed and its own time has come: 300 ms.
			v := c.DecideKey(c.Current(), now.Add(299*time.Millisecond), 0, []byte("k"), 1, 0)
			if v.Outcome != Limited {
				t.Errorf("a request 299 ms on: %v, want limited (the reservations hold the bucket)", v.Outcome)
			}
			c.Finish(v)
			if r.Cancel(ctx) {
				t.Error("Cancel gave back a reservation never taken")
			}
		})
	}
}

// A queue's reservation is its place: the requests before it spaced
// Window/Limit apart, at most burst waiting.
func TestReserveTakesAQueuePlace(t *testing.T) {
	clk := newSteppedClock()
	c := waitCore(t, "rules: [{name: q, limit: 10, window: 1s, burst: 2, algorithm: leaky_bucket, action: delay, mode: sync}]",
		store.NewMemStore(clk), clk)
	now := clk.t
	for i := range 3 {
		r, err := c.Reserve(context.Background(), now, "q", []byte("k"), 1, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK() || r.DelayFrom(now) != time.Duration(i)*100*time.Millisecond {
			t.Fatalf("place %d: OK %v in %v", i, r.OK(), r.DelayFrom(now))
		}
	}
	r, err := c.Reserve(context.Background(), now, "q", []byte("k"), 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if r.OK() || !r.TimeToAct().Equal(now.Add(100*time.Millisecond)) {
		t.Fatalf("a full queue: OK %v, ask again %v on, want 100ms", r.OK(), r.TimeToAct().Sub(now))
	}
}

// A window counter's reservation conforms at once or not at all; Cancel
// gives its units back, sent or not.
func TestReserveOnACounterAndCancel(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			clk := newSteppedClock()
			c := waitCore(t, "rules: [{name: w, limit: 2, window: 1s, mode: "+mode+"}]", store.NewMemStore(clk), clk)
			ctx := context.Background()
			now := clk.t
			var taken []*Reservation
			for range 2 {
				r, err := c.Reserve(ctx, now, "w", []byte("k"), 1, time.Hour)
				if err != nil || !r.OK() || !r.TimeToAct().Equal(now) {
					t.Fatalf("Reserve = %v, %v", r, err)
				}
				taken = append(taken, r)
			}
			r, err := c.Reserve(ctx, now, "w", []byte("k"), 1, time.Hour)
			if err != nil || r.OK() || !r.TimeToAct().Equal(now.Add(time.Second)) {
				t.Fatalf("over the limit: %v, %v; want not OK, ask again 1 s on (when the two leave the trailing window)", r, err)
			}
			if !taken[1].Cancel(ctx) || taken[1].Cancel(ctx) {
				t.Fatal("Cancel: the first call gives back, the second does nothing")
			}
			// The block cache holds the key until the refusal's release:
			// ask after it forgets, within the same window.
			c.blocks.Clear()
			r, err = c.Reserve(ctx, now.Add(time.Millisecond), "w", []byte("k"), 1, time.Hour)
			if err != nil || !r.OK() {
				t.Fatalf("after a Cancel: %v, %v; want the unit given back", r, err)
			}
		})
	}
}

// Wait and Reserve run over every store as over the in-memory one: the
// bucket's reservations and waits exactly spaced, a counter's unit given
// back, a queue's places.
func TestWaitAndReserveOverEveryStore(t *testing.T) {
	const doc = `rules:
  - {name: tb, limit: 10, window: 1s, burst: 1, algorithm: token_bucket, mode: sync}
  - {name: w, limit: 2, window: 1s, mode: sync}
  - {name: q, limit: 10, window: 1s, burst: 1, algorithm: leaky_bucket, action: delay, mode: sync}`
	stores := map[string]func(t *testing.T, clk store.Clock) store.Store{
		"memstore": func(t *testing.T, clk store.Clock) store.Store { return store.NewMemStore(clk) },
		"memcached": func(t *testing.T, _ store.Clock) store.Store {
			mc := testenv.Memcached(t)
			client, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: mc.Addr}}, Timeout: 2 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			s, err := memcachestore.New(client, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"redis": func(t *testing.T, _ store.Clock) store.Store {
			rd := testenv.Redis(t)
			s, err := redisstore.New(redisstore.Config{Addrs: []string{rd.Addr}, Timeout: 2 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			clk := newSteppedClock()
			c := waitCore(t, doc, mk(t, clk), clk)
			ctx := context.Background()
			now := clk.t
			for i := range 3 {
				r, err := c.Reserve(ctx, now, "tb", []byte("k"), 1, time.Second)
				if err != nil || !r.OK() || r.DelayFrom(now) != time.Duration(i)*100*time.Millisecond {
					t.Fatalf("bucket reservation %d: %v, %v", i, r, err)
				}
			}
			if err := c.wait(ctx, clk, "tb", []byte("k"), 1); err != nil {
				t.Fatal(err)
			}
			if len(clk.slept) != 1 || clk.slept[0] != 300*time.Millisecond {
				t.Fatalf("a wait behind three reservations slept %v, want [300ms]", clk.slept)
			}

			now = clk.t
			var second *Reservation
			for range 2 {
				r, err := c.Reserve(ctx, now, "w", []byte("k"), 1, time.Hour)
				if err != nil || !r.OK() {
					t.Fatalf("counter reservation: %v, %v", r, err)
				}
				second = r
			}
			if r, err := c.Reserve(ctx, now, "w", []byte("k"), 1, time.Hour); err != nil || r.OK() {
				t.Fatalf("a third in the window: %v, %v; want not taken", r, err)
			}
			if !second.Cancel(ctx) {
				t.Fatal("Cancel did not give a counter's unit back")
			}
			c.blocks.Clear() // the refusal's block, until its release
			if r, err := c.Reserve(ctx, now, "w", []byte("k"), 1, time.Hour); err != nil || !r.OK() {
				t.Fatalf("after a Cancel: %v, %v; want the unit given back", r, err)
			}

			slept := len(clk.slept)
			for range 2 {
				if err := c.wait(ctx, clk, "q", []byte("k"), 1); err != nil {
					t.Fatal(err)
				}
			}
			if got := clk.slept[slept:]; len(got) != 1 || got[0] != 100*time.Millisecond {
				t.Fatalf("two waits on a queue slept %v, want [100ms]", got)
			}
		})
	}
}

// When the store cannot answer, a waiter is told so, whatever the rule's
// failure policy: it never proceeds on a guess.
func TestWaitStopsWhenTheStoreFails(t *testing.T) {
	// A memcached client to a loopback port nothing listens on.
	client, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))}},
		Timeout: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	backend, err := memcachestore.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := waitCore(t, `rules:
  - {name: open, limit: 10, window: 1s, mode: sync}
  - {name: closed, limit: 10, window: 1s, mode: sync, fail: closed}
  - {name: tb, limit: 10, window: 1s, algorithm: token_bucket, mode: sync}`, backend, nil)
	for _, rule := range []string{"open", "closed", "tb"} {
		if err := c.Wait(context.Background(), rule, []byte("k"), 1); !errors.Is(err, ErrStoreFailed) {
			t.Errorf("Wait(%s) with the store down = %v, want ErrStoreFailed", rule, err)
		}
		if _, err := c.Reserve(context.Background(), time.Now(), rule, []byte("k"), 1, time.Second); !errors.Is(err, ErrStoreFailed) {
			t.Errorf("Reserve(%s) with the store down = %v, want ErrStoreFailed", rule, err)
		}
	}
	if n := testutil.ToFloat64(c.wm.result[waitStoreFailed]); n != 3 {
		t.Errorf("waits_total{result=store_failed} = %v, want 3", n)
	}
}

// flakyStore fails the calls fail says to, as failingStore does, as a
// store that cannot decide for a moment (a compare-and-swap lost every
// round, a reply late in a stall), and answers the others as its Store.
type flakyStore struct {
	store.Store
	fail func() bool
}

// failFirst fails the first n calls.
func failFirst(n int) func() bool {
	return func() bool {
		if n == 0 {
			return false
		}
		n--
		return true
	}
}

func (s *flakyStore) Do(ctx context.Context, ops []store.Op) {
	if s.fail() {
		failingStore{}.Do(ctx, ops)
		return
	}
	s.Store.Do(ctx, ops)
}

func (s *flakyStore) DoState(ctx context.Context, ops []store.StateOp) {
	if s.fail() {
		failingStore{}.DoState(ctx, ops)
		return
	}
	s.Store.DoState(ctx, ops)
}

// A store that fails for a moment does not stop a waiter: it asks again
// 10 ms and then 20 ms later, and only a third failure running returns
// ErrStoreFailed.
func TestWaitAsksAgainAfterAStoreFailure(t *testing.T) {
	for _, rule := range waitFailRules {
		for _, fails := range []int{1, 2, 3} {
			clk := newSteppedClock()
			backend := &flakyStore{Store: store.NewMemStore(clk), fail: failFirst(fails)}
			c := waitCore(t, "rules: ["+rule+"]", backend, clk)
			err := c.wait(context.Background(), clk, "r", []byte("k"), 1)
			want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}[:min(fails, 2)]
			switch {
			case fails <= 2 && err != nil:
				t.Errorf("%s, %d failures: %v, want admitted", rule, fails, err)
			case fails > 2 && !errors.Is(err, ErrStoreFailed):
				t.Errorf("%s, %d failures: %v, want ErrStoreFailed", rule, fails, err)
			}
			if !slices.Equal(clk.slept, want) {
				t.Errorf("%s, %d failures: slept %v, want %v", rule, fails, clk.slept, want)
			}
		}
	}
}

// waitFailRules are a rule of each kind of shared state, at 1 a second.
var waitFailRules = []string{
	"{name: r, limit: 1, window: 1s, mode: sync}",
	"{name: r, limit: 1, window: 1s, algorithm: token_bucket, mode: sync}",
	"{name: r, limit: 1, window: 1s, algorithm: sliding_log}",
}

// Failures count while they run: two failures, a refusal, a wait, and two
// more failures still end admitted.
func TestWaitCountsStoreFailuresRunning(t *testing.T) {
	for _, rule := range waitFailRules {
		clk := newSteppedClock()
		t0 := clk.Now()
		// Down for the first 25 ms of each half second from t0, when the
		// waiter first asks and when the unit spent at t0 − 500 ms frees.
		down := func() bool { return clk.Now().Sub(t0)%(500*time.Millisecond) < 25*time.Millisecond }
		backend := &flakyStore{Store: store.NewMemStore(clk), fail: func() bool { return false }}
		c := waitCore(t, "rules: ["+rule+"]", backend, clk)
		clk.t = t0.Add(-500 * time.Millisecond) // the key's one unit, spent before
		if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
			t.Fatalf("%s: the first unit: %v", rule, err)
		}
		clk.t, clk.slept, backend.fail = t0, nil, down
		if err := c.wait(context.Background(), clk, "r", []byte("k"), 1); err != nil {
			t.Errorf("%s: %v (slept %v), want admitted after two failures, a wait and two failures", rule, err, clk.slept)
		}
		ms := time.Millisecond
		if want := []time.Duration{10 * ms, 20 * ms, 470 * ms, 10 * ms, 20 * ms}; !slices.Equal(clk.slept, want) {
			t.Errorf("%s: slept %v, want %v: asked again 10 and 20 ms after failures, before and after the wait", rule, clk.slept, want)
		}
	}
}
