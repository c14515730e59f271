package decision_test

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/decision"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// newCore returns a core deciding by the rules in doc over store: the
// in-memory store here; memcachestore.New or redisstore.New to share the
// limits with every process using the same servers.
func newCore(doc string, store store.Store) (*decision.Core, func()) {
	rs, err := rules.ParseRules([]byte(doc))
	if err != nil {
		panic(err)
	}
	lim, err := window.New(window.Config{}, store)
	if err != nil {
		panic(err)
	}
	lim.Start()
	blocks, err := blockcache.New(blockcache.Config{}, nil)
	if err != nil {
		panic(err)
	}
	core, err := decision.NewCore(decision.CoreConfig{}, rs, decision.CoreDeps{Limiter: lim, Blocks: blocks})
	if err != nil {
		panic(err)
	}
	return core, func() { lim.Close(context.Background()); blocks.Close() }
}

// A crawler polite to each host: one budget per host (the rule's key is
// the host), a fetch every 50 ms at most per host, hosts independent of
// each other. Every crawler process sharing the store shares each host's
// budget.
func ExampleCore_Wait_crawler() {
	core, closeCore := newCore(`rules:
  - {name: per-host, limit: 20, window: 1s, burst: 1, algorithm: token_bucket, mode: sync}`,
		store.NewMemStore(nil))
	defer closeCore()

	queue := []string{
		"https://a.example/", "https://a.example/about", "https://b.example/",
		"https://a.example/contact", "https://b.example/news",
	}
	// Per host, from its first Wait to its latest fetch: the n fetches
	// of a host span (n − 1) × 50 ms at least.
	type seen struct {
		first, latest time.Time
		n             int
	}
	hosts := map[string]*seen{}
	for _, raw := range queue {
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		h := hosts[u.Host]
		if h == nil {
			h = &seen{first: time.Now()}
			hosts[u.Host] = h
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = core.Wait(ctx, "per-host", []byte(u.Host), 1)
		cancel()
		if err != nil {
			fmt.Println("skip", raw, err)
			continue
		}
		h.latest, h.n = time.Now(), h.n+1
		fmt.Println("fetch", raw) // http.Get(raw) here
	}
	polite := true
	for _, h := range hosts {
		if h.latest.Sub(h.first) < time.Duration(h.n-1)*50*time.Millisecond {
			polite = false
		}
	}
	fmt.Println("each host's fetches 50 ms apart or more:", polite)
	// Output:
	// fetch https://a.example/
	// fetch https://a.example/about
	// fetch https://b.example/
	// fetch https://a.example/contact
	// fetch https://b.example/news
	// each host's fetches 50 ms apart or more: true
}

// A client of an API that allows 5 calls per 100 ms: every call waits its
// turn instead of drawing a 429, from however many goroutines and
// processes share the store.
func ExampleCore_Wait_apiClient() {
	core, closeCore := newCore(`rules:
  - {name: partner-api, limit: 5, window: 100ms, algorithm: sliding_log}`,
		store.NewMemStore(nil))
	defer closeCore()

	var asked, called []time.Time
	for i := 0; i < 12; i++ {
		asked = append(asked, time.Now())
		if err := core.Wait(context.Background(), "partner-api", []byte("our-api-key"), 1); err != nil {
			fmt.Println(err)
			return
		}
		called = append(called, time.Now()) // the call to the API here
	}
	within := true
	for i := 5; i < len(called); i++ {
		// A sliding log holds every 100 ms to 5: the 6th call after
		// any comes 100 ms or more after it was asked for.
		if called[i].Sub(asked[i-5]) < 100*time.Millisecond {
			within = false
		}
	}
	fmt.Println(len(called), "calls, at most 5 in any 100 ms:", within)

	// A cost above what the rule ever admits is refused at once.
	err := core.Wait(context.Background(), "partner-api", []byte("our-api-key"), 6)
	fmt.Println(err)
	// Output:
	// 12 calls, at most 5 in any 100 ms: true
	// decision: rule "partner-api": cost 6, at most 5: the cost is above what the rule ever admits at once
}
