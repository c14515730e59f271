package event_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/policy"
)

// TestDecodeV3 decodes every sample event that version 3 can carry from
// its version 3 bytes: not counting; it re-encodes as version 4.
func TestDecodeV3(t *testing.T) {
	for name, e := range eventtest.Samples() {
		e := eventtest.AsV3(e)
		b := eventtest.AppendV3(nil, &e)
		var got event.Event
		if err := event.Decode(b, &got); err != nil || !eventtest.Equal(&got, &e) {
			t.Errorf("%s through v3: got %+v, %v, want %+v", name, got, err, e)
		}
		if len(b) > event.MaxLen-11 {
			t.Errorf("%s: v3 encoding of %d bytes, want at most 340", name, len(b))
		}
	}
}

// TestDecodeV2 decodes every sample event that version 2 can carry from
// its version 2 bytes: an empty PoP, scope pop; it re-encodes as version 4.
func TestDecodeV2(t *testing.T) {
	for name, e := range eventtest.Samples() {
		e := eventtest.AsV2(e)
		var got event.Event
		if err := event.Decode(eventtest.AppendV2(nil, &e), &got); err != nil || !eventtest.Equal(&got, &e) {
			t.Errorf("%s through v2: got %+v, %v, want %+v", name, got, err, e)
		}
	}
}

func TestEventRoundTrip(t *testing.T) {
	for name, want := range eventtest.Samples() {
		t.Run(name, func(t *testing.T) {
			b, err := event.Append([]byte("prefix"), &want)
			if err != nil {
				t.Fatalf("Append: got %v, want nil", err)
			}
			if !bytes.HasPrefix(b, []byte("prefix")) {
				t.Fatalf("Append overwrote dst: got %q", b[:6])
			}
			b = b[len("prefix"):]
			if got, want := len(b), event.EncodedLen(&want); got != want {
				t.Errorf("encoded length: got %d, want EncodedLen %d", got, want)
			}
			if len(b) > event.MaxLen {
				t.Errorf("encoded length: got %d, want <= MaxLen %d", len(b), event.MaxLen)
			}
			var got event.Event
			if err := event.Decode(b, &got); err != nil {
				t.Fatalf("Decode: got %v, want nil", err)
			}
			if !eventtest.Equal(&got, &want) {
				t.Errorf("round trip: got %+v, want %+v", got, want)
			}
		})
	}
}

func TestEventMaxLen(t *testing.T) {
	e := eventtest.Samples()["max"]
	if got, want := event.EncodedLen(&e), event.MaxLen; got != want {
		t.Errorf("EncodedLen of the longest event: got %d, want %d", got, want)
	}
}

// TestEventLayout pins the documented layout of version 4 with a golden
// encoding, not counting and counting.
func TestEventLayout(t *testing.T) {
	e := event.Event{
		Time: 1, Edge: 2, Rule: []byte("ab"), KeyHash: 0x0102030405060708, Cost: 1, Limit: 300,
		WindowMillis: 1000, Burst: 600, Estimate: 1.5, Decision: event.Limited, Action: policy.Block,
		Fallback: true, Algorithm: policy.LeakyBucket, Delayed: true, DelayMicros: 1500,
		Pop: []byte("p1"), Global: true,
	}
	b, err := event.Append(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	const want = "04" + "e5" + "03" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "01" + "ac02" + "e807" + "d804" + "dc0b" + "02" + "6162" + "02" + "7031" + "00"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("encoding: got %s, want %s", got, want)
	}
	e.Cost, e.Counting, e.Counted, e.SettleMicros = 3, true, 2, 300
	if b, err = event.Append(nil, &e); err != nil {
		t.Fatal(err)
	}
	const wantCounting = "04" + "e5" + "03" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "03" + "ac02" + "e807" + "d804" + "dc0b" + "02" + "6162" + "02" + "7031" + "01" + "02" + "ac02"
	if got := hex.EncodeToString(b); got != wantCounting {
		t.Errorf("counting encoding: got %s, want %s", got, wantCounting)
	}
}

// TestDecodeCountingErrors refuses the counting byte's malformations: a
// reserved bit, a count over the cost, a non-minimal or truncated varint.
func TestDecodeCountingErrors(t *testing.T) {
	e := event.Event{Cost: 2, Counting: true, Counted: 1, SettleMicros: 5}
	good := eventtest.Encode(t, e)
	n := len(good)
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"reserved bit", mod(func(b []byte) []byte { b[n-3] |= 2; return b }), event.ErrMalformed},
		{"counted over cost", mod(func(b []byte) []byte { b[n-2] = 3; return b }), event.ErrMalformed},
		{"non-minimal settle", append(mod(func(b []byte) []byte { b[n-1] = 0x85; return b }), 0), event.ErrMalformed},
		{"no settle", good[:n-1], event.ErrTruncated},
		{"no counting byte", good[:n-3], event.ErrTruncated},
		{"trailing", append(bytes.Clone(good), 0), event.ErrTrailing},
		{"counts without counting", mod(func(b []byte) []byte { b[n-3] = 0; return b }), event.ErrTrailing},
	}
	for _, tt := range tests {
		var got event.Event
		if err := event.Decode(tt.b, &got); !errors.Is(err, tt.want) {
			t.Errorf("%s: Decode(%x) got %v, want %v", tt.name, tt.b, err, tt.want)
		}
	}
}

// TestDecodeV1 decodes a golden version 1 encoding: a sliding-window event
// whose burst is its limit, which re-encodes as version 2.
func TestDecodeV1(t *testing.T) {
	const v1 = "01" + "25" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "01" + "ac02" + "e807" + "02" + "6162"
	b, _ := hex.DecodeString(v1)
	var got event.Event
	if err := event.Decode(b, &got); err != nil {
		t.Fatalf("Decode(v1): got %v, want nil", err)
	}
	want := event.Event{
		Time: 1, Edge: 2, Rule: []byte("ab"), KeyHash: 0x0102030405060708, Cost: 1, Limit: 300,
		WindowMillis: 1000, Burst: 300, Estimate: 1.5, Decision: event.Limited, Action: policy.Block,
		Fallback: true, Algorithm: policy.SlidingWindow,
	}
	if !eventtest.Equal(&got, &want) {
		t.Errorf("v1 event: got %+v, want %+v", got, want)
	}
	if enc := eventtest.AppendV1(nil, &got); !bytes.Equal(enc, b) {
		t.Errorf("v1 re-encoding by the test's encoder: got %x, want %x", enc, b)
	}
	enc, err := event.Append(nil, &got)
	if err != nil || enc[0] != event.Version {
		t.Fatalf("Append of a v1 event: got %x, %v, want version %d bytes", enc, err, event.Version)
	}
	var again event.Event
	if err := event.Decode(enc, &again); err != nil || !eventtest.Equal(&again, &want) {
		t.Errorf("v1 → v2 → decode: got %+v, %v, want %+v", again, err, want)
	}
	// Every sample event that v1 can carry round-trips through it.
	for name, e := range eventtest.Samples() {
		e := eventtest.AsV1(e)
		var got event.Event
		if err := event.Decode(eventtest.AppendV1(nil, &e), &got); err != nil || !eventtest.Equal(&got, &e) {
			t.Errorf("%s through v1: got %+v, %v, want %+v", name, got, err, e)
		}
	}
}

func TestAppendEventErrors(t *testing.T) {
	tests := []struct {
		name string
		e    event.Event
		want error
	}{
		{"rule too long", event.Event{Rule: make([]byte, event.MaxRuleLen+1)}, event.ErrRuleTooLong},
		{"PoP name too long", event.Event{Pop: make([]byte, event.MaxPopLen+1)}, event.ErrRuleTooLong},
		{"bad decision", event.Event{Decision: 2}, event.ErrMalformed},
		{"bad mode", event.Event{Mode: 2}, event.ErrMalformed},
		{"bad action", event.Event{Action: 2}, event.ErrMalformed},
		{"bad algorithm", event.Event{Algorithm: 5}, event.ErrMalformed},
		{"delay without delayed", event.Event{DelayMicros: 1}, event.ErrMalformed},
		{"count without counting", event.Event{Cost: 1, Counted: 1}, event.ErrMalformed},
		{"settle without counting", event.Event{SettleMicros: 1}, event.ErrMalformed},
		{"count over cost", event.Event{Cost: 1, Counted: 2, Counting: true}, event.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("x")
			got, err := event.Append(dst, &tt.e)
			if !errors.Is(err, tt.want) {
				t.Errorf("error: got %v, want %v", err, tt.want)
			}
			if string(got) != "x" {
				t.Errorf("dst: got %q, want it unchanged %q", got, "x")
			}
			if n := event.EncodedLen(&tt.e); n != 0 {
				t.Errorf("EncodedLen: got %d, want 0", n)
			}
		})
	}
}

func TestDecodeEventErrors(t *testing.T) {
	valid := eventtest.Encode(t, eventtest.Samples()["typical"])
	with := func(b []byte, i int, v byte) []byte {
		b = bytes.Clone(b)
		b[i] = v
		return b
	}
	// minimal: one-byte varints, so the varints start at 23 (v2) and 22 (v1).
	minimal := eventtest.Encode(t, event.Event{Rule: []byte("r")})
	delayed := eventtest.Encode(t, event.Event{Rule: []byte("r"), Delayed: true, Algorithm: policy.LeakyBucket})
	typicalV1 := eventtest.Samples()["typical"]
	v1 := eventtest.AppendV1(nil, &typicalV1)
	v2 := eventtest.AppendV2(nil, &typicalV1)
	minimalV1 := eventtest.AppendV1(nil, &event.Event{Rule: []byte("r")})
	splice := func(b []byte, at, skip int, ins ...byte) []byte {
		return append(append(bytes.Clone(b[:at]), ins...), b[at+skip:]...)
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, event.ErrTruncated},
		{"version 0", with(valid, 0, 0), event.ErrVersion},
		{"version 5", with(valid, 0, 5), event.ErrVersion},
		{"future version, short", []byte{5}, event.ErrVersion},
		{"v3 trailing byte", append(eventtest.AppendV3(nil, &typicalV1), 0), event.ErrTrailing},
		{"v2 reserved flag 7", with(v2, 1, 1<<7), event.ErrMalformed},
		{"v2 trailing byte", append(bytes.Clone(v2), 0), event.ErrTrailing},
		{"PoP name over 32 bytes", append(append(bytes.Clone(valid[:len(valid)-2]), 33), append(bytes.Repeat([]byte("p"), 33), 0)...), event.ErrMalformed},
		{"cut in PoP name", append(bytes.Clone(valid[:len(valid)-2]), 2, 'p'), event.ErrTruncated},
		{"cut before the counting byte", valid[:len(valid)-1], event.ErrTruncated},
		{"a frame", with(valid, 0, 0x81), event.ErrVersion},
		{"version only", []byte{2}, event.ErrTruncated},
		{"v1 version only", []byte{1}, event.ErrTruncated},
		{"head only", valid[:23], event.ErrTruncated},
		{"v1 head only", v1[:22], event.ErrTruncated},
		{"cut in rule", valid[:len(valid)-1], event.ErrTruncated},
		{"v1 cut in rule", v1[:len(v1)-1], event.ErrTruncated},
		{"cut before rule length", minimal[:28], event.ErrTruncated},
		{"cut before the delay", delayed[:28], event.ErrTruncated},
		{"trailing byte", append(bytes.Clone(valid), 0), event.ErrTrailing},
		{"v1 trailing byte", append(bytes.Clone(v1), 0), event.ErrTrailing},
		{"two events", append(bytes.Clone(valid), valid...), event.ErrTrailing},
		{"v1 reserved flag 6", with(v1, 1, 1<<6), event.ErrMalformed},
		{"v1 reserved flag 7", with(v1, 1, 1<<7), event.ErrMalformed},
		{"algorithm 5", with(valid, 2, 5), event.ErrMalformed},
		{"algorithm 255", with(valid, 2, 255), event.ErrMalformed},
		{"non-minimal varint", splice(minimal, 23, 1, 0x80, 0x00), event.ErrMalformed},
		{"v1 non-minimal varint", splice(minimalV1, 22, 1, 0x80, 0x00), event.ErrMalformed},
		{"edge over 65535", splice(minimal, 23, 1, 0x80, 0x80, 0x04), event.ErrMalformed},
		{"cost over 2^32-1", splice(minimal, 24, 1, 0x80, 0x80, 0x80, 0x80, 0x10), event.ErrMalformed},
		{"burst over 2^32-1", splice(minimal, 27, 1, 0x80, 0x80, 0x80, 0x80, 0x10), event.ErrMalformed},
		{"delay over 2^32-1", splice(delayed, 28, 1, 0x80, 0x80, 0x80, 0x80, 0x10), event.ErrMalformed},
		{"delay not minimal", splice(delayed, 28, 1, 0x80, 0x00), event.ErrMalformed},
		{"varint overflows 64 bits", append(bytes.Clone(minimal[:23]), bytes.Repeat([]byte{0xff}, 11)...), event.ErrMalformed},
		{"varint cut", append(bytes.Clone(minimal[:23]), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80), event.ErrTruncated},
		{"rule length past end", append(bytes.Clone(minimal[:28]), 9, 'a'), event.ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := event.Event{Edge: 7}
			err := event.Decode(tt.in, &e)
			if !errors.Is(err, tt.want) {
				t.Errorf("Decode(%x): got %v, want %v", tt.in, err, tt.want)
			}
			if e.Edge != 7 {
				t.Errorf("event after error: got Edge %d, want it unchanged (7)", e.Edge)
			}
		})
	}
}

func TestDecodeEventRuleIsCapacityLimited(t *testing.T) {
	b := eventtest.Encode(t, event.Event{Rule: []byte("abc")})
	b = append(b, 'z')[:len(b)] // spare capacity after the rule
	var e event.Event
	if err := event.Decode(b, &e); err != nil {
		t.Fatal(err)
	}
	_ = append(e.Rule, 'X')
	if got := b[:len(b)+1][len(b)]; got != 'z' {
		t.Errorf("appending to Rule wrote past the event: got %q, want %q", got, 'z')
	}
}

func TestEventAllocs(t *testing.T) {
	e := eventtest.Samples()["typical"]
	buf := make([]byte, 0, event.MaxLen)
	if got := testing.AllocsPerRun(1000, func() {
		buf, _ = event.Append(buf[:0], &e)
	}); got != 0 {
		t.Errorf("Append allocs: got %v, want 0", got)
	}
	var out event.Event
	if got := testing.AllocsPerRun(1000, func() {
		if err := event.Decode(buf, &out); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("Decode allocs: got %v, want 0", got)
	}
	bad := buf[:10]
	if got := testing.AllocsPerRun(1000, func() { _ = event.Decode(bad, &out) }); got != 0 {
		t.Errorf("Decode allocs on error: got %v, want 0", got)
	}
	c := eventtest.Samples()["counted"]
	if got := testing.AllocsPerRun(1000, func() {
		buf, _ = event.Append(buf[:0], &c)
		if err := event.Decode(buf, &out); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("Append and Decode allocs, counting: got %v, want 0", got)
	}
	buf, _ = event.Append(buf[:0], &e)
	v1 := eventtest.AppendV1(nil, &e)
	if got := testing.AllocsPerRun(1000, func() {
		if err := event.Decode(v1, &out); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("Decode allocs, version 1: got %v, want 0", got)
	}
}

func TestEnumStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{event.Allowed.String(), "allowed"},
		{event.Limited.String(), "limited"},
		{event.Admission(9).String(), "Admission(9)"},
		{policy.Async.String(), "async"},
		{policy.Sync.String(), "sync"},
		{policy.Mode(9).String(), "Mode(9)"},
		{policy.Throttle.String(), "throttle"},
		{policy.Block.String(), "block"},
		{policy.Action(9).String(), "Action(9)"},
		{policy.SlidingWindow.String(), "sliding_window"},
		{policy.FixedWindow.String(), "fixed_window"},
		{policy.TokenBucket.String(), "token_bucket"},
		{policy.LeakyBucket.String(), "leaky_bucket"},
		{policy.SlidingLog.String(), "sliding_log"},
		{policy.Algorithm(9).String(), "Algorithm(9)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String: got %q, want %q", tt.got, tt.want)
		}
	}
}

// FuzzDecode checks that Decode never panics, fails only with a
// sentinel, and is canonical: a version 4 input re-encodes to itself, and a
// version 3, 2 or 1 input to the bytes of the test's encoder of its version
// and to a version 4 encoding that decodes to the same event.
func FuzzDecode(f *testing.F) {
	for _, e := range eventtest.Samples() {
		e2, e3, e1 := eventtest.AsV2(e), eventtest.AsV3(e), eventtest.AsV1(e)
		for _, b := range [][]byte{eventtest.Encode(f, e), eventtest.AppendV1(nil, &e1), eventtest.AppendV2(nil, &e2),
			eventtest.AppendV3(nil, &e3)} {
			f.Add(b)
			for _, n := range []int{0, 1, 2, 3, 21, 22, 23, 24, len(b) - 1} {
				if n >= 0 && n < len(b) {
					f.Add(b[:n])
				}
			}
			f.Add(append(bytes.Clone(b), 0))
		}
	}
	f.Add([]byte{4, 0})
	f.Add([]byte{3, 0})
	f.Add([]byte{1, 0xff})
	f.Add([]byte{2, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e event.Event
		err := event.Decode(b, &e)
		if err != nil {
			for _, known := range []error{event.ErrVersion, event.ErrTruncated, event.ErrTrailing, event.ErrMalformed} {
				if errors.Is(err, known) {
					return
				}
			}
			t.Fatalf("Decode(%x): got error %v, want a package sentinel", b, err)
		}
		enc, err := event.Append(nil, &e)
		if err != nil {
			t.Fatalf("Append of a decoded event: got %v, want nil", err)
		}
		if got, want := len(enc), event.EncodedLen(&e); got != want || got > event.MaxLen {
			t.Fatalf("encoded length: got %d, want EncodedLen %d, at most MaxLen", got, want)
		}
		switch b[0] {
		case event.Version:
			if !bytes.Equal(enc, b) {
				t.Fatalf("re-encoding: got %x, want the input %x (the encoding is canonical)", enc, b)
			}
		case event.VersionV3:
			if e.Counting {
				t.Fatalf("v3 event: got Counting; want false")
			}
			if v3 := eventtest.AppendV3(nil, &e); !bytes.Equal(v3, b) {
				t.Fatalf("v3 re-encoding: got %x, want the input %x (the encoding is canonical)", v3, b)
			}
		case event.VersionV2:
			if len(e.Pop) > 0 || e.Global {
				t.Fatalf("v2 event: got PoP %q, global %v; want none", e.Pop, e.Global)
			}
			if v2 := eventtest.AppendV2(nil, &e); !bytes.Equal(v2, b) {
				t.Fatalf("v2 re-encoding: got %x, want the input %x (the encoding is canonical)", v2, b)
			}
		case event.VersionV1:
			if e.Algorithm != policy.SlidingWindow || e.Burst != e.Limit || e.Delayed {
				t.Fatalf("v1 event: got algorithm %v, burst %d (limit %d), delayed %v; want sliding_window, the limit, false",
					e.Algorithm, e.Burst, e.Limit, e.Delayed)
			}
			if v1 := eventtest.AppendV1(nil, &e); !bytes.Equal(v1, b) {
				t.Fatalf("v1 re-encoding: got %x, want the input %x (the encoding is canonical)", v1, b)
			}
		default:
			t.Fatalf("Decode accepted version %d", b[0])
		}
		var again event.Event
		if err := event.Decode(enc, &again); err != nil {
			t.Fatalf("decoding the re-encoding: got %v, want nil", err)
		}
		if !eventtest.Equal(&again, &e) {
			t.Fatalf("decode, encode, decode: got %+v, want %+v", again, e)
		}
		if enc2, _ := event.Append(nil, &again); !bytes.Equal(enc2, enc) {
			t.Fatalf("encode, decode, encode: got %x, want %x", enc2, enc)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	e := eventtest.Samples()["typical"]
	buf := make([]byte, 0, event.MaxLen)
	b.ReportAllocs()
	b.SetBytes(int64(event.EncodedLen(&e)))
	for b.Loop() {
		buf, _ = event.Append(buf[:0], &e)
	}
}

func BenchmarkDecode(b *testing.B) {
	e := eventtest.Samples()["typical"]
	buf := eventtest.Encode(b, e)
	var out event.Event
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if err := event.Decode(buf, &out); err != nil {
			b.Fatal(err)
		}
	}
}
