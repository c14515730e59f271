package pipeline_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"testing"

	"github.com/poplimit/poplimit/pipeline"
)

// sampleEvents are events worth round-tripping: zero, extremes of every
// field, every flag and algorithm alone.
func sampleEvents() map[string]pipeline.Event {
	long := bytes.Repeat([]byte("r"), pipeline.MaxRuleLen)
	longPop := bytes.Repeat([]byte("p"), pipeline.MaxPopLen)
	return map[string]pipeline.Event{
		"zero": {},
		"typical": {
			Time: 1_700_000_000_123_456_789, Edge: 3, Rule: []byte("api-login"), KeyHash: 0x9e3779b97f4a7c15,
			Cost: 1, Limit: 100, Burst: 100, WindowMillis: 60_000, Estimate: 79.5,
			Decision: pipeline.Limited, Mode: pipeline.ModeSync, Action: pipeline.ActionThrottle,
		},
		"max": {
			Time: math.MaxInt64, Edge: math.MaxUint16, Rule: long, Pop: longPop, Global: true, KeyHash: math.MaxUint64,
			Cost: math.MaxUint32, Limit: math.MaxUint32, WindowMillis: math.MaxUint32, Estimate: math.MaxFloat32,
			Burst: math.MaxUint32, DelayMicros: math.MaxUint32, Algorithm: pipeline.AlgorithmSlidingLog,
			Decision: pipeline.Limited, Mode: pipeline.ModeSync, Action: pipeline.ActionBlock,
			FromBlockCache: true, Shadow: true, Fallback: true, Delayed: true,
		},
		"negative time":     {Time: math.MinInt64, Estimate: -1},
		"limited":           {Decision: pipeline.Limited},
		"sync":              {Mode: pipeline.ModeSync},
		"block":             {Action: pipeline.ActionBlock},
		"from block cache":  {FromBlockCache: true},
		"shadow":            {Shadow: true},
		"fallback":          {Fallback: true},
		"varint edges":      {Edge: 127, Cost: 128, Limit: 16383, WindowMillis: 16384, Burst: 2_097_152},
		"infinite estimate": {Estimate: float32(math.Inf(1))},
		"fixed window":      {Algorithm: pipeline.AlgorithmFixedWindow, Limit: 10, Burst: 10},
		"token bucket":      {Algorithm: pipeline.AlgorithmTokenBucket, Limit: 10, Burst: 50, WindowMillis: 1000},
		"leaky bucket":      {Algorithm: pipeline.AlgorithmLeakyBucket, Limit: 10, Burst: 5, WindowMillis: 1000},
		"delayed":           {Algorithm: pipeline.AlgorithmLeakyBucket, Limit: 10, Burst: 5, Delayed: true, DelayMicros: 250_000},
		"delayed by 0":      {Algorithm: pipeline.AlgorithmLeakyBucket, Delayed: true},
		"sliding log":       {Algorithm: pipeline.AlgorithmSlidingLog, Limit: 3, Burst: 3},
		"pop":               {Pop: []byte("fra1"), Rule: []byte("api")},
		"global":            {Global: true, Pop: []byte("ams2"), Limit: 100, Burst: 100},
	}
}

// equalEvents compares events field by field, the estimate by its bits.
func equalEvents(a, b *pipeline.Event) bool {
	return a.Time == b.Time && a.Edge == b.Edge && bytes.Equal(a.Rule, b.Rule) && a.KeyHash == b.KeyHash &&
		a.Cost == b.Cost && a.Limit == b.Limit && a.WindowMillis == b.WindowMillis &&
		math.Float32bits(a.Estimate) == math.Float32bits(b.Estimate) &&
		a.Decision == b.Decision && a.Mode == b.Mode && a.Action == b.Action &&
		a.FromBlockCache == b.FromBlockCache && a.Shadow == b.Shadow && a.Fallback == b.Fallback &&
		a.Algorithm == b.Algorithm && a.Burst == b.Burst && a.Delayed == b.Delayed && a.DelayMicros == b.DelayMicros &&
		bytes.Equal(a.Pop, b.Pop) && a.Global == b.Global
}

// appendV1 appends the version 1 encoding of e (the layout before
// algorithms), as producers before version 2 wrote it; e must be valid
// for it (no algorithm but sliding_window, no delay, Burst ignored).
func appendV1(dst []byte, e *pipeline.Event) []byte {
	var flags byte
	for i, set := range []bool{e.Decision == pipeline.Limited, e.Mode == pipeline.ModeSync,
		e.Action == pipeline.ActionBlock, e.FromBlockCache, e.Shadow, e.Fallback} {
		if set {
			flags |= 1 << i
		}
	}
	dst = append(dst, pipeline.VersionV1, flags)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Time))
	dst = binary.BigEndian.AppendUint64(dst, e.KeyHash)
	dst = binary.BigEndian.AppendUint32(dst, math.Float32bits(e.Estimate))
	for _, v := range []uint64{uint64(e.Edge), uint64(e.Cost), uint64(e.Limit), uint64(e.WindowMillis)} {
		dst = binary.AppendUvarint(dst, v)
	}
	dst = append(dst, byte(len(e.Rule)))
	return append(dst, e.Rule...)
}

// asV1 returns e as a version 1 event decodes: sliding window, Burst = Limit, no delay.
func asV1(e pipeline.Event) pipeline.Event {
	e = asV2(e)
	e.Algorithm, e.Burst, e.Delayed, e.DelayMicros = pipeline.AlgorithmSlidingWindow, e.Limit, false, 0
	return e
}

// asV2 is e without what version 2 cannot carry: its PoP and scope.
func asV2(e pipeline.Event) pipeline.Event {
	e.Pop, e.Global = nil, false
	return e
}

// appendV2 appends the version 2 encoding of e (the layout before PoPs),
// as producers before version 3 wrote it: version 3's without the PoP
// name's length, under version byte 2. e must carry no PoP nor Global.
func appendV2(dst []byte, e *pipeline.Event) []byte {
	b, err := pipeline.AppendEvent(nil, e)
	if err != nil || len(e.Pop) > 0 || e.Global {
		panic("appendV2: not a version 2 event")
	}
	b[0] = pipeline.VersionV2
	return append(dst, b[:len(b)-1]...)
}

// TestDecodeV2 decodes every sample event that version 2 can carry from
// its version 2 bytes: an empty PoP, scope pop; it re-encodes as version 3.
func TestDecodeV2(t *testing.T) {
	for name, e := range sampleEvents() {
		e := asV2(e)
		var got pipeline.Event
		if err := pipeline.DecodeEvent(appendV2(nil, &e), &got); err != nil || !equalEvents(&got, &e) {
			t.Errorf("%s through v2: got %+v, %v, want %+v", name, got, err, e)
		}
	}
}

func TestEventRoundTrip(t *testing.T) {
	for name, want := range sampleEvents() {
		t.Run(name, func(t *testing.T) {
			b, err := pipeline.AppendEvent([]byte("prefix"), &want)
			if err != nil {
				t.Fatalf("AppendEvent: got %v, want nil", err)
			}
			if !bytes.HasPrefix(b, []byte("prefix")) {
				t.Fatalf("AppendEvent overwrote dst: got %q", b[:6])
			}
			b = b[len("prefix"):]
			if got, want := len(b), pipeline.EncodedLen(&want); got != want {
				t.Errorf("encoded length: got %d, want EncodedLen %d", got, want)
			}
			if len(b) > pipeline.MaxEventLen {
				t.Errorf("encoded length: got %d, want <= MaxEventLen %d", len(b), pipeline.MaxEventLen)
			}
			var got pipeline.Event
			if err := pipeline.DecodeEvent(b, &got); err != nil {
				t.Fatalf("DecodeEvent: got %v, want nil", err)
			}
			if !equalEvents(&got, &want) {
				t.Errorf("round trip: got %+v, want %+v", got, want)
			}
		})
	}
}

func TestEventMaxLen(t *testing.T) {
	e := sampleEvents()["max"]
	if got, want := pipeline.EncodedLen(&e), pipeline.MaxEventLen; got != want {
		t.Errorf("EncodedLen of the longest event: got %d, want %d", got, want)
	}
}

// TestEventLayout pins the documented layout of version 3 with a golden
// encoding.
func TestEventLayout(t *testing.T) {
	e := pipeline.Event{
		Time: 1, Edge: 2, Rule: []byte("ab"), KeyHash: 0x0102030405060708, Cost: 1, Limit: 300,
		WindowMillis: 1000, Burst: 600, Estimate: 1.5, Decision: pipeline.Limited, Action: pipeline.ActionBlock,
		Fallback: true, Algorithm: pipeline.AlgorithmLeakyBucket, Delayed: true, DelayMicros: 1500,
		Pop: []byte("p1"), Global: true,
	}
	b, err := pipeline.AppendEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	const want = "03" + "e5" + "03" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "01" + "ac02" + "e807" + "d804" + "dc0b" + "02" + "6162" + "02" + "7031"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("encoding: got %s, want %s", got, want)
	}
}

// TestDecodeV1 decodes a golden version 1 encoding: a sliding-window event
// whose burst is its limit, which re-encodes as version 2.
func TestDecodeV1(t *testing.T) {
	const v1 = "01" + "25" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "01" + "ac02" + "e807" + "02" + "6162"
	b, _ := hex.DecodeString(v1)
	var got pipeline.Event
	if err := pipeline.DecodeEvent(b, &got); err != nil {
		t.Fatalf("DecodeEvent(v1): got %v, want nil", err)
	}
	want := pipeline.Event{
		Time: 1, Edge: 2, Rule: []byte("ab"), KeyHash: 0x0102030405060708, Cost: 1, Limit: 300,
		WindowMillis: 1000, Burst: 300, Estimate: 1.5, Decision: pipeline.Limited, Action: pipeline.ActionBlock,
		Fallback: true, Algorithm: pipeline.AlgorithmSlidingWindow,
	}
	if !equalEvents(&got, &want) {
		t.Errorf("v1 event: got %+v, want %+v", got, want)
	}
	if enc := appendV1(nil, &got); !bytes.Equal(enc, b) {
		t.Errorf("v1 re-encoding by the test's encoder: got %x, want %x", enc, b)
	}
	enc, err := pipeline.AppendEvent(nil, &got)
	if err != nil || enc[0] != pipeline.Version {
		t.Fatalf("AppendEvent of a v1 event: got %x, %v, want version %d bytes", enc, err, pipeline.Version)
	}
	var again pipeline.Event
	if err := pipeline.DecodeEvent(enc, &again); err != nil || !equalEvents(&again, &want) {
		t.Errorf("v1 → v2 → decode: got %+v, %v, want %+v", again, err, want)
	}
	// Every sample event that v1 can carry round-trips through it.
	for name, e := range sampleEvents() {
		e := asV1(e)
		var got pipeline.Event
		if err := pipeline.DecodeEvent(appendV1(nil, &e), &got); err != nil || !equalEvents(&got, &e) {
			t.Errorf("%s through v1: got %+v, %v, want %+v", name, got, err, e)
		}
	}
}

func TestAppendEventErrors(t *testing.T) {
	tests := []struct {
		name string
		e    pipeline.Event
		want error
	}{
		{"rule too long", pipeline.Event{Rule: make([]byte, pipeline.MaxRuleLen+1)}, pipeline.ErrRuleTooLong},
		{"PoP name too long", pipeline.Event{Pop: make([]byte, pipeline.MaxPopLen+1)}, pipeline.ErrRuleTooLong},
		{"bad decision", pipeline.Event{Decision: 2}, pipeline.ErrMalformed},
		{"bad mode", pipeline.Event{Mode: 2}, pipeline.ErrMalformed},
		{"bad action", pipeline.Event{Action: 2}, pipeline.ErrMalformed},
		{"bad algorithm", pipeline.Event{Algorithm: 5}, pipeline.ErrMalformed},
		{"delay without delayed", pipeline.Event{DelayMicros: 1}, pipeline.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("x")
			got, err := pipeline.AppendEvent(dst, &tt.e)
			if !errors.Is(err, tt.want) {
				t.Errorf("error: got %v, want %v", err, tt.want)
			}
			if string(got) != "x" {
				t.Errorf("dst: got %q, want it unchanged %q", got, "x")
			}
			if n := pipeline.EncodedLen(&tt.e); n != 0 {
				t.Errorf("EncodedLen: got %d, want 0", n)
			}
		})
	}
}

func mustEncode(t testing.TB, e pipeline.Event) []byte {
	t.Helper()
	b, err := pipeline.AppendEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeEventErrors(t *testing.T) {
	valid := mustEncode(t, sampleEvents()["typical"])
	with := func(b []byte, i int, v byte) []byte {
		b = bytes.Clone(b)
		b[i] = v
		return b
	}
	// minimal: one-byte varints, so the varints start at 23 (v2) and 22 (v1).
	minimal := mustEncode(t, pipeline.Event{Rule: []byte("r")})
	delayed := mustEncode(t, pipeline.Event{Rule: []byte("r"), Delayed: true, Algorithm: pipeline.AlgorithmLeakyBucket})
	typicalV1 := sampleEvents()["typical"]
	v1 := appendV1(nil, &typicalV1)
	v2 := appendV2(nil, &typicalV1)
	minimalV1 := appendV1(nil, &pipeline.Event{Rule: []byte("r")})
	splice := func(b []byte, at, skip int, ins ...byte) []byte {
		return append(append(bytes.Clone(b[:at]), ins...), b[at+skip:]...)
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, pipeline.ErrTruncated},
		{"version 0", with(valid, 0, 0), pipeline.ErrVersion},
		{"version 4", with(valid, 0, 4), pipeline.ErrVersion},
		{"future version, short", []byte{4}, pipeline.ErrVersion},
		{"v2 reserved flag 7", with(v2, 1, 1<<7), pipeline.ErrMalformed},
		{"v2 trailing byte", append(bytes.Clone(v2), 0), pipeline.ErrTrailing},
		{"PoP name over 32 bytes", append(append(bytes.Clone(valid[:len(valid)-1]), 33), bytes.Repeat([]byte("p"), 33)...), pipeline.ErrMalformed},
		{"cut in PoP name", append(bytes.Clone(valid[:len(valid)-1]), 2, 'p'), pipeline.ErrTruncated},
		{"a frame", with(valid, 0, 0x81), pipeline.ErrVersion},
		{"version only", []byte{2}, pipeline.ErrTruncated},
		{"v1 version only", []byte{1}, pipeline.ErrTruncated},
		{"head only", valid[:23], pipeline.ErrTruncated},
		{"v1 head only", v1[:22], pipeline.ErrTruncated},
		{"cut in rule", valid[:len(valid)-1], pipeline.ErrTruncated},
		{"v1 cut in rule", v1[:len(v1)-1], pipeline.ErrTruncated},
		{"cut before rule length", minimal[:28], pipeline.ErrTruncated},
		{"cut before the delay", delayed[:28], pipeline.ErrTruncated},
		{"trailing byte", append(bytes.Clone(valid), 0), pipeline.ErrTrailing},
		{"v1 trailing byte", append(bytes.Clone(v1), 0), pipeline.ErrTrailing},
		{"two events", append(bytes.Clone(valid), valid...), pipeline.ErrTrailing},
		{"v1 reserved flag 6", with(v1, 1, 1<<6), pipeline.ErrMalformed},
		{"v1 reserved flag 7", with(v1, 1, 1<<7), pipeline.ErrMalformed},
		{"algorithm 5", with(valid, 2, 5), pipeline.ErrMalformed},
		{"algorithm 255", with(valid, 2, 255), pipeline.ErrMalformed},
		{"non-minimal varint", splice(minimal, 23, 1, 0x80, 0x00), pipeline.ErrMalformed},
		{"v1 non-minimal varint", splice(minimalV1, 22, 1, 0x80, 0x00), pipeline.ErrMalformed},
		{"edge over 65535", splice(minimal, 23, 1, 0x80, 0x80, 0x04), pipeline.ErrMalformed},
		{"cost over 2^32-1", splice(minimal, 24, 1, 0x80, 0x80, 0x80, 0x80, 0x10), pipeline.ErrMalformed},
		{"burst over 2^32-1", splice(minimal, 27, 1, 0x80, 0x80, 0x80, 0x80, 0x10), pipeline.ErrMalformed},
		{"delay over 2^32-1", splice(delayed, 28, 1, 0x80, 0x80, 0x80, 0x80, 0x10), pipeline.ErrMalformed},
		{"delay not minimal", splice(delayed, 28, 1, 0x80, 0x00), pipeline.ErrMalformed},
		{"varint overflows 64 bits", append(bytes.Clone(minimal[:23]), bytes.Repeat([]byte{0xff}, 11)...), pipeline.ErrMalformed},
		{"varint cut", append(bytes.Clone(minimal[:23]), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80), pipeline.ErrTruncated},
		{"rule length past end", append(bytes.Clone(minimal[:28]), 9, 'a'), pipeline.ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := pipeline.Event{Edge: 7}
			err := pipeline.DecodeEvent(tt.in, &e)
			if !errors.Is(err, tt.want) {
				t.Errorf("DecodeEvent(%x): got %v, want %v", tt.in, err, tt.want)
			}
			if e.Edge != 7 {
				t.Errorf("event after error: got Edge %d, want it unchanged (7)", e.Edge)
			}
		})
	}
}

func TestDecodeEventRuleIsCapacityLimited(t *testing.T) {
	b := mustEncode(t, pipeline.Event{Rule: []byte("abc")})
	b = append(b, 'z')[:len(b)] // spare capacity after the rule
	var e pipeline.Event
	if err := pipeline.DecodeEvent(b, &e); err != nil {
		t.Fatal(err)
	}
	_ = append(e.Rule, 'X')
	if got := b[:len(b)+1][len(b)]; got != 'z' {
		t.Errorf("appending to Rule wrote past the event: got %q, want %q", got, 'z')
	}
}

func TestEventAllocs(t *testing.T) {
	e := sampleEvents()["typical"]
	buf := make([]byte, 0, pipeline.MaxEventLen)
	if got := testing.AllocsPerRun(1000, func() {
		buf, _ = pipeline.AppendEvent(buf[:0], &e)
	}); got != 0 {
		t.Errorf("AppendEvent allocs: got %v, want 0", got)
	}
	var out pipeline.Event
	if got := testing.AllocsPerRun(1000, func() {
		if err := pipeline.DecodeEvent(buf, &out); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("DecodeEvent allocs: got %v, want 0", got)
	}
	bad := buf[:10]
	if got := testing.AllocsPerRun(1000, func() { _ = pipeline.DecodeEvent(bad, &out) }); got != 0 {
		t.Errorf("DecodeEvent allocs on error: got %v, want 0", got)
	}
	v1 := appendV1(nil, &e)
	if got := testing.AllocsPerRun(1000, func() {
		if err := pipeline.DecodeEvent(v1, &out); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("DecodeEvent allocs, version 1: got %v, want 0", got)
	}
}

func TestEnumStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{pipeline.Allowed.String(), "allowed"},
		{pipeline.Limited.String(), "limited"},
		{pipeline.Decision(9).String(), "Decision(9)"},
		{pipeline.ModeAsync.String(), "async"},
		{pipeline.ModeSync.String(), "sync"},
		{pipeline.Mode(9).String(), "Mode(9)"},
		{pipeline.ActionThrottle.String(), "throttle"},
		{pipeline.ActionBlock.String(), "block"},
		{pipeline.Action(9).String(), "Action(9)"},
		{pipeline.AlgorithmSlidingWindow.String(), "sliding_window"},
		{pipeline.AlgorithmFixedWindow.String(), "fixed_window"},
		{pipeline.AlgorithmTokenBucket.String(), "token_bucket"},
		{pipeline.AlgorithmLeakyBucket.String(), "leaky_bucket"},
		{pipeline.AlgorithmSlidingLog.String(), "sliding_log"},
		{pipeline.Algorithm(9).String(), "Algorithm(9)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String: got %q, want %q", tt.got, tt.want)
		}
	}
}

// FuzzDecodeEvent checks that DecodeEvent never panics, fails only with a
// sentinel, and is canonical: a version 3 input re-encodes to itself, and a
// version 2 or 1 input to the bytes of the test's encoder of its version
// and to a version 3 encoding that decodes to the same event.
func FuzzDecodeEvent(f *testing.F) {
	for _, e := range sampleEvents() {
		e2 := asV2(e)
		for _, b := range [][]byte{mustEncode(f, e), appendV1(nil, &e), appendV2(nil, &e2)} {
			f.Add(b)
			for _, n := range []int{0, 1, 2, 3, 21, 22, 23, 24, len(b) - 1} {
				if n >= 0 && n < len(b) {
					f.Add(b[:n])
				}
			}
			f.Add(append(bytes.Clone(b), 0))
		}
	}
	f.Add([]byte{3, 0})
	f.Add([]byte{1, 0xff})
	f.Add([]byte{2, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e pipeline.Event
		err := pipeline.DecodeEvent(b, &e)
		if err != nil {
			for _, known := range []error{pipeline.ErrVersion, pipeline.ErrTruncated, pipeline.ErrTrailing, pipeline.ErrMalformed} {
				if errors.Is(err, known) {
					return
				}
			}
			t.Fatalf("DecodeEvent(%x): got error %v, want a package sentinel", b, err)
		}
		enc, err := pipeline.AppendEvent(nil, &e)
		if err != nil {
			t.Fatalf("AppendEvent of a decoded event: got %v, want nil", err)
		}
		if got, want := len(enc), pipeline.EncodedLen(&e); got != want || got > pipeline.MaxEventLen {
			t.Fatalf("encoded length: got %d, want EncodedLen %d, at most MaxEventLen", got, want)
		}
		switch b[0] {
		case pipeline.Version:
			if !bytes.Equal(enc, b) {
				t.Fatalf("re-encoding: got %x, want the input %x (the encoding is canonical)", enc, b)
			}
		case pipeline.VersionV2:
			if len(e.Pop) > 0 || e.Global {
				t.Fatalf("v2 event: got PoP %q, global %v; want none", e.Pop, e.Global)
			}
			if v2 := appendV2(nil, &e); !bytes.Equal(v2, b) {
				t.Fatalf("v2 re-encoding: got %x, want the input %x (the encoding is canonical)", v2, b)
			}
		case pipeline.VersionV1:
			if e.Algorithm != pipeline.AlgorithmSlidingWindow || e.Burst != e.Limit || e.Delayed {
				t.Fatalf("v1 event: got algorithm %v, burst %d (limit %d), delayed %v; want sliding_window, the limit, false",
					e.Algorithm, e.Burst, e.Limit, e.Delayed)
			}
			if v1 := appendV1(nil, &e); !bytes.Equal(v1, b) {
				t.Fatalf("v1 re-encoding: got %x, want the input %x (the encoding is canonical)", v1, b)
			}
		default:
			t.Fatalf("DecodeEvent accepted version %d", b[0])
		}
		var again pipeline.Event
		if err := pipeline.DecodeEvent(enc, &again); err != nil {
			t.Fatalf("decoding the re-encoding: got %v, want nil", err)
		}
		if !equalEvents(&again, &e) {
			t.Fatalf("decode, encode, decode: got %+v, want %+v", again, e)
		}
		if enc2, _ := pipeline.AppendEvent(nil, &again); !bytes.Equal(enc2, enc) {
			t.Fatalf("encode, decode, encode: got %x, want %x", enc2, enc)
		}
	})
}

func BenchmarkAppendEvent(b *testing.B) {
	e := sampleEvents()["typical"]
	buf := make([]byte, 0, pipeline.MaxEventLen)
	b.ReportAllocs()
	b.SetBytes(int64(pipeline.EncodedLen(&e)))
	for b.Loop() {
		buf, _ = pipeline.AppendEvent(buf[:0], &e)
	}
}

func BenchmarkDecodeEvent(b *testing.B) {
	e := sampleEvents()["typical"]
	buf := mustEncode(b, e)
	var out pipeline.Event
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := pipeline.DecodeEvent(buf, &out); err != nil {
			b.Fatal(err)
		}
	}
}
