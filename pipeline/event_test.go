package pipeline_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"testing"

	"github.com/poplimit/poplimit/pipeline"
)

// sampleEvents are events worth round-tripping: zero, extremes of every
// field, every flag alone.
func sampleEvents() map[string]pipeline.Event {
	long := bytes.Repeat([]byte("r"), pipeline.MaxRuleLen)
	return map[string]pipeline.Event{
		"zero": {},
		"typical": {
			Time: 1_700_000_000_123_456_789, Edge: 3, Rule: []byte("api-login"), KeyHash: 0x9e3779b97f4a7c15,
			Cost: 1, Limit: 100, WindowMillis: 60_000, Estimate: 79.5,
			Decision: pipeline.Limited, Mode: pipeline.ModeSync, Action: pipeline.ActionThrottle,
		},
		"max": {
			Time: math.MaxInt64, Edge: math.MaxUint16, Rule: long, KeyHash: math.MaxUint64,
			Cost: math.MaxUint32, Limit: math.MaxUint32, WindowMillis: math.MaxUint32, Estimate: math.MaxFloat32,
			Decision: pipeline.Limited, Mode: pipeline.ModeSync, Action: pipeline.ActionBlock,
			FromBlockCache: true, Shadow: true, Fallback: true,
		},
		"negative time":     {Time: math.MinInt64, Estimate: -1},
		"limited":           {Decision: pipeline.Limited},
		"sync":              {Mode: pipeline.ModeSync},
		"block":             {Action: pipeline.ActionBlock},
		"from block cache":  {FromBlockCache: true},
		"shadow":            {Shadow: true},
		"fallback":          {Fallback: true},
		"varint edges":      {Edge: 127, Cost: 128, Limit: 16383, WindowMillis: 16384},
		"infinite estimate": {Estimate: float32(math.Inf(1))},
	}
}

// equalEvents compares events field by field, the estimate by its bits.
func equalEvents(a, b *pipeline.Event) bool {
	return a.Time == b.Time && a.Edge == b.Edge && bytes.Equal(a.Rule, b.Rule) && a.KeyHash == b.KeyHash &&
		a.Cost == b.Cost && a.Limit == b.Limit && a.WindowMillis == b.WindowMillis &&
		math.Float32bits(a.Estimate) == math.Float32bits(b.Estimate) &&
		a.Decision == b.Decision && a.Mode == b.Mode && a.Action == b.Action &&
		a.FromBlockCache == b.FromBlockCache && a.Shadow == b.Shadow && a.Fallback == b.Fallback
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

// TestEventLayout pins the documented layout with a golden encoding.
func TestEventLayout(t *testing.T) {
	e := pipeline.Event{
		Time: 1, Edge: 2, Rule: []byte("ab"), KeyHash: 0x0102030405060708, Cost: 1, Limit: 300,
		WindowMillis: 1000, Estimate: 1.5, Decision: pipeline.Limited, Action: pipeline.ActionBlock, Fallback: true,
	}
	b, err := pipeline.AppendEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	const want = "01" + "25" + "0000000000000001" + "0102030405060708" + "3fc00000" +
		"02" + "01" + "ac02" + "e807" + "02" + "6162"
	if got := hex.EncodeToString(b); got != want {
		t.Errorf("encoding: got %s, want %s", got, want)
	}
}

func TestAppendEventErrors(t *testing.T) {
	tests := []struct {
		name string
		e    pipeline.Event
		want error
	}{
		{"rule too long", pipeline.Event{Rule: make([]byte, pipeline.MaxRuleLen+1)}, pipeline.ErrRuleTooLong},
		{"bad decision", pipeline.Event{Decision: 2}, pipeline.ErrMalformed},
		{"bad mode", pipeline.Event{Mode: 2}, pipeline.ErrMalformed},
		{"bad action", pipeline.Event{Action: 2}, pipeline.ErrMalformed},
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
	with := func(i int, v byte) []byte {
		b := bytes.Clone(valid)
		b[i] = v
		return b
	}
	// minimal: one-byte varints, so the varints start at 22.
	minimal := mustEncode(t, pipeline.Event{Rule: []byte("r")})
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, pipeline.ErrTruncated},
		{"version 0", with(0, 0), pipeline.ErrVersion},
		{"version 2", with(0, 2), pipeline.ErrVersion},
		{"future version, short", []byte{2}, pipeline.ErrVersion},
		{"version only", []byte{1}, pipeline.ErrTruncated},
		{"head only", valid[:22], pipeline.ErrTruncated},
		{"cut in rule", valid[:len(valid)-1], pipeline.ErrTruncated},
		{"cut before rule length", minimal[:26], pipeline.ErrTruncated},
		{"trailing byte", append(bytes.Clone(valid), 0), pipeline.ErrTrailing},
		{"two events", append(bytes.Clone(valid), valid...), pipeline.ErrTrailing},
		{"reserved flag 6", with(1, 1<<6), pipeline.ErrMalformed},
		{"reserved flag 7", with(1, 1<<7), pipeline.ErrMalformed},
		{"non-minimal varint", append(append(bytes.Clone(minimal[:22]), 0x80, 0x00), minimal[23:]...), pipeline.ErrMalformed},
		{"edge over 65535", append(append(bytes.Clone(minimal[:22]), 0x80, 0x80, 0x04), minimal[23:]...), pipeline.ErrMalformed},
		{"cost over 2^32-1", append(append(bytes.Clone(minimal[:23]), 0x80, 0x80, 0x80, 0x80, 0x10), minimal[24:]...), pipeline.ErrMalformed},
		{"varint overflows 64 bits", append(bytes.Clone(minimal[:22]), bytes.Repeat([]byte{0xff}, 11)...), pipeline.ErrMalformed},
		{"varint cut", append(bytes.Clone(minimal[:22]), 0x80, 0x80, 0x80, 0x80, 0x80), pipeline.ErrTruncated},
		{"rule length past end", append(bytes.Clone(minimal[:26]), 9, 'a'), pipeline.ErrTruncated},
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
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String: got %q, want %q", tt.got, tt.want)
		}
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for _, e := range sampleEvents() {
		b := mustEncode(f, e)
		f.Add(b)
		for _, n := range []int{0, 1, 2, 21, 22, 23, len(b) - 1} {
			if n >= 0 && n < len(b) {
				f.Add(b[:n])
			}
		}
		f.Add(append(bytes.Clone(b), 0))
	}
	f.Add([]byte{2, 0})
	f.Add([]byte{1, 0xff})
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
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoding: got %x, want the input %x (the encoding is canonical)", enc, b)
		}
		var again pipeline.Event
		if err := pipeline.DecodeEvent(enc, &again); err != nil {
			t.Fatalf("decoding the re-encoding: got %v, want nil", err)
		}
		if !equalEvents(&again, &e) {
			t.Fatalf("decode, encode, decode: got %+v, want %+v", again, e)
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
