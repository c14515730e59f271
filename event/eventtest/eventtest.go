// Package eventtest holds what the tests of events and of their transport
// share: sample events of every field's extremes, a field-by-field
// comparison, and the older encodings (versions 1, 2 and 3) that readers still
// accept but nothing writes any more.
package eventtest

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/policy"
)

// Samples returns events worth round-tripping: zero, extremes of every
// field, every flag and algorithm alone.
func Samples() map[string]event.Event {
	long := bytes.Repeat([]byte("r"), event.MaxRuleLen)
	longPop := bytes.Repeat([]byte("p"), event.MaxPopLen)
	return map[string]event.Event{
		"zero": {},
		"typical": {
			Time: 1_700_000_000_123_456_789, Edge: 3, Rule: []byte("api-login"), KeyHash: 0x9e3779b97f4a7c15,
			Cost: 1, Limit: 100, Burst: 100, WindowMillis: 60_000, Estimate: 79.5,
			Decision: event.Limited, Mode: policy.Sync, Action: policy.Throttle,
		},
		"max": {
			Time: math.MaxInt64, Edge: math.MaxUint16, Rule: long, Pop: longPop, Global: true, KeyHash: math.MaxUint64,
			Cost: math.MaxUint32, Limit: math.MaxUint32, WindowMillis: math.MaxUint32, Estimate: math.MaxFloat32,
			Burst: math.MaxUint32, DelayMicros: math.MaxUint32, Algorithm: policy.SlidingLog,
			Decision: event.Limited, Mode: policy.Sync, Action: policy.Block,
			FromBlockCache: true, Shadow: true, Fallback: true, Delayed: true,
			Counting: true, Counted: math.MaxUint32, SettleMicros: math.MaxUint32,
		},
		"negative time":     {Time: math.MinInt64, Estimate: -1},
		"limited":           {Decision: event.Limited},
		"sync":              {Mode: policy.Sync},
		"block":             {Action: policy.Block},
		"from block cache":  {FromBlockCache: true},
		"shadow":            {Shadow: true},
		"fallback":          {Fallback: true},
		"varint edges":      {Edge: 127, Cost: 128, Limit: 16383, WindowMillis: 16384, Burst: 2_097_152},
		"infinite estimate": {Estimate: float32(math.Inf(1))},
		"fixed window":      {Algorithm: policy.FixedWindow, Limit: 10, Burst: 10},
		"token bucket":      {Algorithm: policy.TokenBucket, Limit: 10, Burst: 50, WindowMillis: 1000},
		"leaky bucket":      {Algorithm: policy.LeakyBucket, Limit: 10, Burst: 5, WindowMillis: 1000},
		"delayed":           {Algorithm: policy.LeakyBucket, Limit: 10, Burst: 5, Delayed: true, DelayMicros: 250_000},
		"delayed by 0":      {Algorithm: policy.LeakyBucket, Delayed: true},
		"sliding log":       {Algorithm: policy.SlidingLog, Limit: 3, Burst: 3},
		"pop":               {Pop: []byte("fra1"), Rule: []byte("api")},
		"global":            {Global: true, Pop: []byte("ams2"), Limit: 100, Burst: 100},
		"counted":           {Counting: true, Cost: 1, Counted: 1, SettleMicros: 35_000, Limit: 5, Burst: 5},
		"not counted":       {Counting: true, Cost: 3, SettleMicros: 1, Limit: 5, Burst: 5},
		"counting refused":  {Counting: true, Cost: 1, Decision: event.Limited, Limit: 5, Burst: 5},
		"unsettled":         {Counting: true, Cost: 2, Counted: 2, SettleMicros: 30_000_000, Pop: []byte("p")},
	}
}

// Equal reports whether a and b are the same event, compared field by
// field, the estimate by its bits.
func Equal(a, b *event.Event) bool {
	return a.Time == b.Time && a.Edge == b.Edge && bytes.Equal(a.Rule, b.Rule) && a.KeyHash == b.KeyHash &&
		a.Cost == b.Cost && a.Limit == b.Limit && a.WindowMillis == b.WindowMillis &&
		math.Float32bits(a.Estimate) == math.Float32bits(b.Estimate) &&
		a.Decision == b.Decision && a.Mode == b.Mode && a.Action == b.Action &&
		a.FromBlockCache == b.FromBlockCache && a.Shadow == b.Shadow && a.Fallback == b.Fallback &&
		a.Algorithm == b.Algorithm && a.Burst == b.Burst && a.Delayed == b.Delayed && a.DelayMicros == b.DelayMicros &&
		bytes.Equal(a.Pop, b.Pop) && a.Global == b.Global &&
		a.Counting == b.Counting && a.Counted == b.Counted && a.SettleMicros == b.SettleMicros
}

// AppendV1 appends the version 1 encoding of e (the layout before
// algorithms), as producers before version 2 wrote it; e must be valid
// for it (no algorithm but sliding_window, no delay, Burst ignored).
func AppendV1(dst []byte, e *event.Event) []byte {
	var flags byte
	for i, set := range []bool{e.Decision == event.Limited, e.Mode == policy.Sync,
		e.Action == policy.Block, e.FromBlockCache, e.Shadow, e.Fallback} {
		if set {
			flags |= 1 << i
		}
	}
	dst = append(dst, event.VersionV1, flags)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.BigEndian.AppendUint64(dst, e.KeyHash)
	dst = binary.BigEndian.AppendUint32(dst, math.Float32bits(e.Estimate))
	for _, v := range []uint64{uint64(e.Edge), uint64(e.Cost), uint64(e.Limit), uint64(e.WindowMillis)} {
		dst = binary.AppendUvarint(dst, v)
	}
	dst = append(dst, byte(len(e.Rule)))
	return append(dst, e.Rule...)
}

// AsV1 returns e as a version 1 event decodes: sliding window, Burst =
// Limit, no delay.
func AsV1(e event.Event) event.Event {
	e = AsV2(e)
	e.Algorithm, e.Burst, e.Delayed, e.DelayMicros = policy.SlidingWindow, e.Limit, false, 0
	return e
}

// AsV2 is e without what version 2 cannot carry: its PoP and scope, and
// what version 3 cannot.
func AsV2(e event.Event) event.Event {
	e = AsV3(e)
	e.Pop, e.Global = nil, false
	return e
}

// AsV3 is e without what version 3 cannot carry: its counting fields.
func AsV3(e event.Event) event.Event {
	e.Counting, e.Counted, e.SettleMicros = false, 0, 0
	return e
}

// AppendV3 appends the version 3 encoding of e (the layout before
// counting by response), as producers before version 4 wrote it: version
// 4's without the counting byte, under version byte 3. e must not be
// Counting.
func AppendV3(dst []byte, e *event.Event) []byte {
	b, err := event.Append(nil, e)
	if err != nil || e.Counting {
		panic("AppendV3: not a version 3 event")
	}
	b[0] = event.VersionV3
	return append(dst, b[:len(b)-1]...)
}

// AppendV2 appends the version 2 encoding of e (the layout before PoPs),
// as producers before version 3 wrote it: version 3's without the PoP
// name's length, under version byte 2. e must carry no PoP nor Global.
func AppendV2(dst []byte, e *event.Event) []byte {
	if len(e.Pop) > 0 || e.Global {
		panic("AppendV2: not a version 2 event")
	}
	b := AppendV3(nil, e)
	b[0] = event.VersionV2
	return append(dst, b[:len(b)-1]...)
}

// Encode returns the encoding of e, failing t if Append refuses it.
func Encode(t testing.TB, e event.Event) []byte {
	t.Helper()
	b, err := event.Append(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
