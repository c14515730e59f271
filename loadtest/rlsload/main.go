// Command rlsload is a closed-loop load generator for Envoy's rate limit
// service (gRPC envoy.service.ratelimit.v3.RateLimitService), with the
// generated client Envoy's own types come from: -conns connections, each
// with -workers callers, for -duration, every call one descriptor
// (-key=<user N>, N cycling over -keys) of -domain. It prints one line:
// calls/s, p50 and p99 in microseconds, and how many calls failed.
//
//	rlsload -target 127.0.0.1:8081 -domain bench -key user -keys 10000 -duration 5s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func main() {
	target := flag.String("target", "127.0.0.1:8081", "the service's host:port")
	domain := flag.String("domain", "bench", "rate limit domain")
	key := flag.String("key", "user", "descriptor entry key")
	keys := flag.Int("keys", 10000, "distinct descriptor values, cycled")
	conns := flag.Int("conns", 4, "gRPC connections")
	workers := flag.Int("workers", 16, "concurrent callers per connection")
	dur := flag.Duration("duration", 5*time.Second, "how long to send")
	flag.Parse()
	if *keys < 1 || *conns < 1 || *workers < 1 || *dur <= 0 || *dur > time.Hour {
		fmt.Fprintln(os.Stderr, "rlsload: -keys, -conns and -workers must be at least 1, -duration in (0, 1h]")
		os.Exit(2)
	}
	reqs := make([]*rlspb.RateLimitRequest, *keys)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: *domain, Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: *key, Value: "u" + strconv.Itoa(i)}}}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	var next, failed atomic.Int64
	var firstErr sync.Once
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for c := 0; c < *conns; c++ {
		cc, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "rlsload:", err)
			os.Exit(1)
		}
		defer cc.Close()
		client := rlspb.NewRateLimitServiceClient(cc)
		for w := 0; w < *workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mine := make([]time.Duration, 0, 1<<16)
				for ctx.Err() == nil {
					r := reqs[next.Add(1)%int64(len(reqs))]
					begin := time.Now()
					_, err := client.ShouldRateLimit(ctx, r)
					if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
						break // the run's end (grpc's timer can fire before the context's)
					}
					if err != nil {
						failed.Add(1)
						firstErr.Do(func() { fmt.Fprintln(os.Stderr, "rlsload: first failed call:", err) })
						continue
					}
					mine = append(mine, time.Since(begin))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds())
	}
	fmt.Printf("%.0f %.0f %.0f %d\n", float64(len(lat))/dur.Seconds(), pct(0.50), pct(0.99), failed.Load())
}
