package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The client comparison behind the package's choice of rueidis: the same
// commands through rueidis and through go-redis v9, against one real
// redis-server, in the two shapes the store sends. "batch" is the async
// flush: 256 counter increments pipelined in one call; "single" is the sync
// path: one increment, one round trip. Each increment is either one EVALSHA
// of the increment script (INCRBY, then PEXPIRE when the result equals the
// delta) or the pair INCRBY and PEXPIRE NX. Keys and arguments are built
// before the loop, so the figures are the clients' own.
//
//	go test -run '^$' -bench BenchmarkClients -benchtime 2s ./redisstore/

const benchIncrScript = `local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return v`

func benchCounterKeys(n int) []string {
	keys := make([]string, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range keys {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		keys[i] = fmtKey(x, 1_700_000_000_000)
	}
	return keys
}

func BenchmarkClients(b *testing.B) {
	p := startRedis(b)
	ctx := context.Background()
	sum := sha1.Sum([]byte(benchIncrScript))
	sha := hex.EncodeToString(sum[:])
	keys := benchCounterKeys(256)

	ru, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{p.Addr}, DisableCache: true, DisableRetry: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer ru.Close()
	gr := goredis.NewClient(&goredis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	defer gr.Close()
	if err := gr.ScriptLoad(ctx, benchIncrScript).Err(); err != nil {
		b.Fatal(err)
	}

	for _, shape := range []string{"script", "incr+pexpire"} {
		b.Run(fmt.Sprintf("rueidis/batch256/%s", shape), func(b *testing.B) {
			cmds := make(rueidis.Commands, 0, 512)
			b.ReportAllocs()
			for b.Loop() {
				cmds = cmds[:0]
				for _, k := range keys {
					if shape == "script" {
						cmds = append(cmds, ru.B().Evalsha().Sha1(sha).Numkeys(1).Key(k).Arg("1", "120000").Build())
					} else {
						cmds = append(cmds, ru.B().Incrby().Key(k).Increment(1).Build(),
							ru.B().Pexpire().Key(k).Milliseconds(120000).Nx().Build())
					}
				}
				for _, r := range ru.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/counter")
		})
		b.Run(fmt.Sprintf("goredis/batch256/%s", shape), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				pipe := gr.Pipeline()
				for _, k := range keys {
					if shape == "script" {
						pipe.EvalSha(ctx, sha, []string{k}, "1", "120000")
					} else {
						pipe.IncrBy(ctx, k, 1)
						pipe.Do(ctx, "pexpire", k, 120000, "nx")
					}
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/counter")
		})
	}
	b.Run("rueidis/single/script", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := ru.Do(ctx, ru.B().Evalsha().Sha1(sha).Numkeys(1).Key(keys[i&255]).Arg("1", "120000").Build()).Error(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	rp, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{p.Addr}, DisableCache: true, DisableRetry: true, DisableAutoPipelining: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer rp.Close()
	b.Run("rueidis-noautopipe/single/script", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := rp.Do(ctx, rp.B().Evalsha().Sha1(sha).Numkeys(1).Key(keys[i&255]).Arg("1", "120000").Build()).Error(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("goredis/single/script", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := gr.EvalSha(ctx, sha, []string{keys[i&255]}, "1", "120000").Err(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	// The sync path under load: many requests at once, one increment each.
	b.Run("rueidis/parallel16/script", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8) // 16 goroutines on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if err := ru.Do(ctx, ru.B().Evalsha().Sha1(sha).Numkeys(1).Key(keys[i&255]).Arg("1", "120000").Build()).Error(); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
	b.Run("goredis/parallel16/script", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if err := gr.EvalSha(ctx, sha, []string{keys[i&255]}, "1", "120000").Err(); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}
