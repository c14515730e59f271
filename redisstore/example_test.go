package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/redisstore"
	"github.com/poplimit/poplimit/store"
)

// A Store is a store.Store: the Limiter runs over it as over memcached.
// (Not run: it needs a server on 127.0.0.1:6379.)
func ExampleNew() {
	s, err := redisstore.New(redisstore.Config{
		Addrs:   []string{"127.0.0.1:6379"}, // or any nodes of a cluster
		Timeout: 100 * time.Millisecond,
	}, prometheus.NewRegistry())
	if err != nil {
		log.Fatal(err) // an invalid Config; a server that is down is not an error
	}
	defer s.Close()

	var backend store.Store = s
	ops := []store.Op{{Key: 0xdeadbeef, Start: 1_700_000_000_000, Delta: 1, TTL: 2 * time.Minute}}
	backend.Do(context.Background(), ops)
	fmt.Println(ops[0].Value, ops[0].Err)

	// A login rule, exact: 5 attempts per minute, shared by every edge.
	res, err := s.SlidingLog(context.Background(), 0xfeed, redisstore.SlidingLogParams{Limit: 5, Window: time.Minute},
		time.Now().UnixNano(), 1, true)
	fmt.Println(res.Allowed, res.Remaining, err)
}
