package shardproxy_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/shardproxy"
	"github.com/prometheus/client_golang/prometheus"
)

func ExampleRing_Lookup() {
	servers := []shardproxy.Server{
		{Addr: "10.0.0.1:11211", Weight: 1},
		{Addr: "10.0.0.2:11211", Weight: 1},
		{Addr: "10.0.0.3:11211", Weight: 2},
	}
	ring, err := shardproxy.NewRing(servers, shardproxy.HashFNV1a64, "{}")
	if err != nil {
		fmt.Println(err)
		return
	}
	prev := shardproxy.AppendCounterKey(nil, 0x5eed, 1_700_000_000_000)
	curr := shardproxy.AppendCounterKey(nil, 0x5eed, 1_700_000_060_000)
	fmt.Printf("%s -> %s\n", prev, servers[ring.Lookup(prev)].Addr)
	fmt.Printf("%s -> %s\n", curr, servers[ring.Lookup(curr)].Addr)
	// Output:
	// pl:{0000000000005eed}:1700000000000 -> 10.0.0.3:11211
	// pl:{0000000000005eed}:1700000060000 -> 10.0.0.3:11211
}

func ExampleConfig_Validate() {
	cfg := shardproxy.Config{
		Servers: []shardproxy.Server{{Addr: "10.0.0.1"}},
		Timeout: -time.Second,
	}
	fmt.Println(cfg.Validate())
	// Output:
	// shardproxy: config: Servers[0].Addr: "10.0.0.1": address 10.0.0.1: missing port in address
	// Timeout: -1s: want 0 (default) or up to 1m0s
}

// The edge adapts a Client to store.Store with a loop: the two Op types
// have the same fields, so each converts to the other.
func ExampleClient_Do() {
	c, err := shardproxy.New(shardproxy.Config{
		Servers: []shardproxy.Server{{Addr: "127.0.0.1:11211"}, {Addr: "127.0.0.1:11212"}},
	}, prometheus.NewRegistry())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	start := time.Now().Truncate(time.Minute).UnixMilli()
	ops := []shardproxy.Op{
		{Key: 0x5eed, Start: start, Delta: 3, TTL: 2 * time.Minute}, // incr, creating the counter
		{Key: 0x5eed, Start: start - 60_000},                        // read the previous window
	}
	c.Do(context.Background(), ops)
	for _, op := range ops {
		fmt.Println(op.Value, op.Err)
	}
}

func ExampleClient_Incr() {
	c, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: "127.0.0.1:11211"}}}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	n, err := c.Incr(context.Background(), 0x5eed, 1_700_000_000_000, 1, 2*time.Minute)
	fmt.Println(n, err)
}

// A shared value updated by read-modify-write: read it with its token,
// store the new value if nobody changed it meanwhile, and try again if
// somebody did. A missing value is created with Add.
func ExampleClient_CompareAndSwap() {
	c, err := shardproxy.New(shardproxy.Config{Servers: []shardproxy.Server{{Addr: "127.0.0.1:11211"}}}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()
	const key = 0x5eed
	for attempt := 0; attempt < 5; attempt++ {
		old, cas, err := c.Gets(ctx, key)
		switch {
		case errors.Is(err, shardproxy.ErrNotFound):
			err = c.Add(ctx, key, []byte("1"), time.Minute)
		case err == nil:
			n, _ := strconv.Atoi(string(old))
			err = c.CompareAndSwap(ctx, key, []byte(strconv.Itoa(n+1)), cas, time.Minute)
		}
		if errors.Is(err, shardproxy.ErrCASConflict) || errors.Is(err, shardproxy.ErrExists) {
			continue // another edge wrote first: read again
		}
		fmt.Println(err)
		return
	}
}
