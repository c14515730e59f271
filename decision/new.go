package decision

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/blockcache"
	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/slots"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// Options are what New builds a Core with besides its rules and store. The
// zero value is a core with no decision events and unregistered metrics,
// its limiter, slots and block cache at their defaults.
type Options struct {
	// Limiter configures the rate limiter over the store (flush interval,
	// store timeout, failure handling): window.Config's defaults when
	// zero. Its Registerer is set from Registerer below.
	Limiter window.Config
	// Slots configures the concurrency slots over the store.
	Slots slots.Config
	// Blocks caches refused keys until their release, so that a client
	// hammering past its limit is refused from memory, and holds the block
	// of a rule of action: block for its timeout. nil: a blockcache.Cache
	// of BlockCache, closed by Close.
	Blocks     BlockCache
	BlockCache blockcache.Config
	// Events takes one decision event per rule decided (package
	// pipeline's Producer sends them to the aggregator). nil: none.
	Events Emitter
	// Registerer registers the core's and the limiter's metrics. nil: the
	// metrics are kept but not registered.
	Registerer prometheus.Registerer
	// EdgeID and Pop name this process in decision events
	// (CoreConfig.EdgeID, CoreConfig.Pop).
	EdgeID int
	Pop    string
	// RetryJitter is CoreConfig.RetryJitter: the most random time added
	// to a refusal's Retry-After. 0: DefaultRetryJitter; negative: none.
	RetryJitter time.Duration
	// BodyKeyBytes is CoreConfig.BodyKeyBytes: the most of a body read
	// for the rules keyed by it. 0: DefaultBodyKeyBytes.
	BodyKeyBytes int
}

// owned is what a Core built by New runs and stops on Close.
type owned struct {
	lim    *window.Limiter
	slots  *slots.Slots
	blocks *blockcache.Cache // nil when Options.Blocks was given
}

// New returns a core deciding by rs over store, with a limiter and
// concurrency slots of its own, started: the whole limiter of a Go program
// that embeds poplimit (package middleware puts it in front of net/http
// handlers). store is any store.Store: store.NewMemStore for one
// process, memcachestore or redisstore to share the limits with other
// processes. Close the core when done: it stops the limiter, whose last
// flush sends the counts it holds.
//
// An edge assembles its core with NewCore instead, over parts it builds
// and stops itself.
func New(rs *rules.Rules, store store.Store, o Options) (*Core, error) {
	if store == nil {
		return nil, errors.New("decision: New: store is nil (store.NewMemStore(nil) is the in-memory one)")
	}
	own := &owned{}
	blocks := o.Blocks
	if blocks == nil {
		var err error
		if own.blocks, err = blockcache.New(o.BlockCache, o.Registerer); err != nil {
			return nil, err
		}
		blocks = own.blocks
	}
	lc := o.Limiter
	lc.Registerer = o.Registerer
	lim, err := window.New(lc, store)
	if err != nil {
		own.close(context.Background())
		return nil, err
	}
	own.lim, own.slots = lim, slots.New(o.Slots, store)
	c, err := NewCore(CoreConfig{EdgeID: o.EdgeID, Pop: o.Pop, RetryJitter: o.RetryJitter, BodyKeyBytes: o.BodyKeyBytes}, rs,
		CoreDeps{Limiter: lim, Blocks: blocks, Slots: own.slots, Events: o.Events, Registerer: o.Registerer})
	if err != nil {
		own.close(context.Background())
		return nil, err
	}
	c.owned = own
	lim.Start()
	own.slots.Start(0, nil)
	return c, nil
}

// Close stops what New started: the slots' renewer, the limiter, whose
// last flush sends the counts it holds within ctx, and the block cache it
// built. It does nothing for a core built by NewCore, whose parts their
// builder stops. Call it after the server that calls the core has shut
// down (http.Server.Shutdown returns once its handlers have): a decision
// made during or after Close is still answered, but its count may miss the
// last flush and never reach the store.
func (c *Core) Close(ctx context.Context) error {
	if c.owned == nil {
		return nil
	}
	return c.owned.close(ctx)
}

func (o *owned) close(ctx context.Context) error {
	if o.slots != nil {
		o.slots.Close()
	}
	var err error
	if o.lim != nil {
		err = o.lim.Close(ctx)
	}
	if o.blocks != nil {
		o.blocks.Close()
	}
	return err
}

// noBlocks is the block cache of a core built without one: it holds
// nothing.
type noBlocks struct{}

func (noBlocks) Blocked(uint64, int64) (int64, bool) { return 0, false }
func (noBlocks) Block(uint64, int64, int64) bool     { return true }
func (noBlocks) Clear()                              {}
