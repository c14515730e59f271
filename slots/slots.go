package slots

import (
	"context"
	"sync"
	"time"

	"github.com/poplimit/poplimit/algo"
	"github.com/poplimit/poplimit/policy"
	"github.com/poplimit/poplimit/store"
)

// Slots limits requests in flight per key across the PoP (rules of Kind
// Concurrency, Stripe's concurrent-request limiter) over the same Store as
// the Limiter.
//
// # Model
//
// Time is cut into epochs of the rule's Lease. A slot lives in the counter
// of one epoch: Acquire increments the current epoch's counter and admits
// when the count stays within the limit (else it takes its increment back),
// Release decrements the counter its slot lives in. After an epoch ends,
// every edge carries its still-held slots into the new epoch's counter with
// one increment per key (Renew). An edge that died carries nothing, so its
// slots vanish within one to two leases: the lease is what bounds a crashed
// edge's damage. Until the carries have landed (a grace of the renew
// interval plus the store timeout), Acquire also counts the previous
// epoch's slots, so an epoch change never opens the gates; a carried slot
// released is taken out of both counters, so it does not close them either.
//
// Acquire is a store round trip on the request path (concurrency cannot be
// coalesced: the slot is the admission). Its failure policy is the rule's.
// Slots is safe for concurrent use.
type Slots struct {
	store   store.Store
	timeout time.Duration
	grace   time.Duration

	// mu protects held.
	mu   sync.Mutex
	held map[uint64]*heldSlots

	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// heldSlots are one key's slots held by this edge.
type heldSlots struct {
	lease      int64 // ns
	epoch      int64 // start of the epoch the slots in n live in, Unix ns
	n          int64 // slots living in epoch
	old        int64 // slots still living in the epoch before (not yet carried)
	oldEpoch   int64
	failedOpen int64 // slots admitted by fail-open, never counted in the store
	// carried of the slots in n were carried (Renew) from oldEpoch, whose
	// counter still counts them: it is the previous epoch's, which Acquire
	// reads during the grace. Releasing one of them takes it out of both
	// counters, so that a slot carried and then released cannot refuse a
	// request in the grace. Releases take from the slots not carried
	// first: the previous counter never undercounts.
	carried int64
}

// Config configures Slots.
type Config struct {
	StoreTimeout  time.Duration // default 100ms
	RenewInterval time.Duration // how often epochs are checked for carrying; default 100ms
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 100 * time.Millisecond
	}
	if c.RenewInterval <= 0 {
		c.RenewInterval = 100 * time.Millisecond
	}
	return c
}

// New returns Slots over st. Call Start to carry slots across epochs
// in the background, and Close to stop.
func New(cfg Config, st store.Store) *Slots {
	cfg = cfg.WithDefaults()
	return &Slots{store: st, timeout: cfg.StoreTimeout, grace: cfg.RenewInterval + cfg.StoreTimeout,
		held: make(map[uint64]*heldSlots), done: make(chan struct{})}
}

// Start carries held slots into each new epoch every RenewInterval until
// Close.
func (s *Slots) Start(interval time.Duration, clock store.Clock) {
	if clock == nil {
		clock = store.SystemClock
	}
	if interval <= 0 {
		interval = s.grace - s.timeout
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-t.C:
				s.Renew(context.Background(), clock.Now())
			}
		}
	}()
}

// Close stops the renewer. Slots still held are left to expire with their
// lease.
func (s *Slots) Close() {
	s.once.Do(func() { close(s.done); s.wg.Wait() })
}

// Acquire takes one slot for key (limit slots at most) at now, under a
// rule whose slots live lease and which fails by fail. It
// returns whether the request may proceed, and the fallback when the store
// failed. A true result must be matched by one Release.
func (s *Slots) Acquire(ctx context.Context, now time.Time, lease time.Duration, fail policy.Fail, key, limit uint64) (ok bool, fb store.Fallback) {
	t := now.UnixNano()
	ns := int64(lease)
	epoch := algo.WindowStart(t, ns)
	ops := []store.Op{{Key: key, Start: epoch / 1e6, Delta: 1, TTL: 2 * lease}}
	inGrace := t < epoch+int64(s.grace)
	if inGrace {
		ops = append(ops, store.Op{Key: key, Start: (epoch - ns) / 1e6})
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	s.store.Do(ctx, ops)
	cancel()
	if ops[0].Err != nil {
		if fail == policy.FailClosed {
			return false, store.FallbackClosed
		}
		s.mu.Lock()
		s.get(key, ns, epoch).failedOpen++
		s.mu.Unlock()
		return true, store.FallbackOpen
	}
	count := ops[0].Value
	if inGrace && ops[1].Err == nil {
		count = max(count, ops[1].Value+1)
	}
	if count > limit {
		ops = ops[:1]
		ops[0] = store.Op{Key: key, Start: epoch / 1e6, Delta: -1}
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		s.store.Do(ctx, ops)
		cancel()
		return false, store.FallbackNone
	}
	s.mu.Lock()
	h := s.get(key, ns, epoch)
	h.n++
	s.mu.Unlock()
	return true, store.FallbackNone
}

// get returns key's held slots rolled to epoch. s.mu must be held.
func (s *Slots) get(key uint64, lease, epoch int64) *heldSlots {
	h := s.held[key]
	if h == nil {
		h = &heldSlots{lease: lease, epoch: epoch}
		s.held[key] = h
	}
	if epoch > h.epoch {
		// The current slots still live in their old epoch until carried.
		h.old += h.n
		h.oldEpoch = h.epoch
		h.n, h.epoch, h.carried = 0, epoch, 0
	}
	return h
}

// Release gives back one slot of key taken by Acquire at any earlier time.
func (s *Slots) Release(key uint64) {
	s.mu.Lock()
	h := s.held[key]
	if h == nil {
		s.mu.Unlock()
		return
	}
	var buf [2]store.Op
	ops := buf[:0]
	switch {
	case h.failedOpen > 0:
		h.failedOpen--
	case h.old > 0:
		h.old--
		ops = append(ops, store.Op{Key: key, Start: h.oldEpoch / 1e6, Delta: -1})
	case h.n > 0:
		h.n--
		ops = append(ops, store.Op{Key: key, Start: h.epoch / 1e6, Delta: -1})
		if h.n < h.carried {
			h.carried = h.n
			ops = append(ops, store.Op{Key: key, Start: h.oldEpoch / 1e6, Delta: -1})
		}
	}
	if h.n == 0 && h.old == 0 && h.failedOpen == 0 {
		delete(s.held, key)
	}
	s.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	s.store.Do(ctx, ops)
	cancel()
}

// Renew carries the slots this edge holds in past epochs into the epoch
// containing now: one increment per key. It returns how many keys it
// carried.
func (s *Slots) Renew(ctx context.Context, now time.Time) int {
	t := now.UnixNano()
	var ops []store.Op
	s.mu.Lock()
	for key, h := range s.held {
		epoch := algo.WindowStart(t, h.lease)
		if epoch <= h.epoch && h.old == 0 {
			continue
		}
		if epoch > h.epoch {
			h.old += h.n
			h.oldEpoch = h.epoch
			h.n, h.epoch, h.carried = 0, epoch, 0
		}
		if h.old > 0 {
			ops = append(ops, store.Op{Key: key, Start: epoch / 1e6, Delta: h.old, TTL: 2 * time.Duration(h.lease)})
			h.n += h.old
			h.carried = h.old
			h.old = 0
		}
	}
	s.mu.Unlock()
	if len(ops) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	s.store.Do(ctx, ops)
	cancel()
	return len(ops)
}

// Held returns the slots this edge holds for key.
func (s *Slots) Held(key uint64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[key]; h != nil {
		return h.n + h.old + h.failedOpen
	}
	return 0
}
