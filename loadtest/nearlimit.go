package loadtest

import (
	"container/heap"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// NearLimitConfig configures NearLimit: clients of one per-client limit,
// many of them running close to it, the workload where an estimate's
// error decides requests.
type NearLimitConfig struct {
	Seed     uint64
	Clients  int           // default 400
	Limit    int           // the per-client limit per Window; default 100
	Window   time.Duration // default 10s
	Duration time.Duration // default 1m
	Prefix   netip.Prefix  // client addresses, client k at base+k+1; default 10.64.0.0/10
	Endpoint
}

// The shares of NearLimit's clients: near the limit, bursting far over
// it, and the rest well under it.
const (
	nearShare  = 0.25 // steady at 0.9 to 1.3 times the limit
	burstShare = 0.10 // bursts at 3 to 8 times it, a tenth of a window every window
)

// NearLimit returns a trace where a quarter of the clients send steadily
// (Poisson) at 0.9 to 1.3 times their limit, a tenth send bursts at 3 to
// 8 times it (a tenth of a window, once a window, at a phase of their
// own), and the rest at 0.05 to 0.5 times it. Each client's rate is drawn
// once from the seed. Memory is one heap entry per client.
func NearLimit(cfg NearLimitConfig) (Trace, error) {
	if cfg.Clients == 0 {
		cfg.Clients = 400
	}
	if cfg.Limit == 0 {
		cfg.Limit = 100
	}
	if cfg.Window == 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Minute
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = netip.MustParsePrefix("10.64.0.0/10")
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("GET", "/")
	var errs []error
	if cfg.Clients < 1 || cfg.Clients > 1<<20 || uint64(cfg.Clients) >= uint64(1)<<hostBits(cfg.Prefix) {
		errs = append(errs, fmt.Errorf("loadtest: nearlimit: Clients %d: must be between 1 and 2^20 and fit in Prefix %v", cfg.Clients, cfg.Prefix))
	}
	if cfg.Limit < 1 || cfg.Limit > 1_000_000 {
		errs = append(errs, fmt.Errorf("loadtest: nearlimit: Limit %d: must be between 1 and 1,000,000", cfg.Limit))
	}
	if cfg.Window < time.Millisecond || cfg.Window > 24*time.Hour {
		errs = append(errs, fmt.Errorf("loadtest: nearlimit: Window %v: must be between 1ms and 24h", cfg.Window))
	}
	errs = append(errs, checkDuration("nearlimit", cfg.Duration), cfg.Endpoint.check("nearlimit"))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed)
		base := float64(cfg.Limit) / cfg.Window.Seconds() // the limit as a rate, per second
		w := float64(cfg.Window)
		type client struct {
			rate  float64 // requests per second while sending
			burst bool    // sends only in the first tenth of each window after phase
			phase float64 // ns
		}
		cs := make([]client, cfg.Clients)
		h := make(attemptHeap, 0, cfg.Clients) // left holds the client's number
		for k := range cs {
			c := &cs[k]
			switch u := rng.Float64(); {
			case u < nearShare:
				c.rate = base * (0.9 + 0.4*rng.Float64())
			case u < nearShare+burstShare:
				c.rate, c.burst, c.phase = base*(3+5*rng.Float64())*10, true, rng.Float64()*w
			default:
				c.rate = base * (0.05 + 0.45*rng.Float64())
			}
			h = append(h, attempt{at: time.Duration(c.phase + rng.ExpFloat64()/c.rate*1e9), left: k})
		}
		heap.Init(&h)
		for h.Len() > 0 {
			a := h[0]
			if a.at >= cfg.Duration {
				return
			}
			c := &cs[a.left]
			if !yield(cfg.Endpoint.request(a.at, addrAt(cfg.Prefix, uint64(a.left)+1)), nil) {
				return
			}
			next := float64(a.at) + rng.ExpFloat64()/c.rate*1e9
			if c.burst { // past its tenth of the window: on to the next window's
				if into := modf(next-c.phase, w); into >= w/10 {
					next += w - into
				}
			}
			h[0].at = time.Duration(next)
			heap.Fix(&h, 0)
		}
	}, nil
}

// modf is x mod m in [0, m), for m > 0.
func modf(x, m float64) float64 {
	r := x - m*float64(int64(x/m))
	if r < 0 {
		r += m
	}
	return r
}
