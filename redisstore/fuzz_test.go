package redisstore

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// FuzzParseCounter checks the decoding of a stored counter against
// strconv: it accepts exactly the decimal digits of an int64 ≥ 0, and
// never panics.
func FuzzParseCounter(f *testing.F) {
	for _, s := range []string{"0", "7", "007", "9223372036854775807", "9223372036854775808", "-1", "+1",
		"", " 1", "1 ", "1e3", "12abc", "99999999999999999999", "\x001", "１"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseCounter(s)
		digits := len(s) > 0 && len(s) <= 19
		for i := 0; i < len(s); i++ {
			digits = digits && s[i] >= '0' && s[i] <= '9'
		}
		ref, rerr := strconv.ParseInt(s, 10, 64)
		wantOK := digits && rerr == nil
		if (err == nil) != wantOK || wantOK && v != uint64(ref) {
			t.Fatalf("ParseCounter(%q): got %d, %v; want ok %v (%d)", s, v, err, wantOK, ref)
		}
	})
}

// FuzzDecodeGCRAState checks the decoding of the bucket script's reply:
// it accepts exactly a 0 or 1, two decimal int64s and a fraction within
// [0, rate), and never panics.
func FuzzDecodeGCRAState(f *testing.F) {
	f.Add(int64(1), "1700000000000000000", "3", int64(10))
	f.Add(int64(0), "-5", "0", int64(1))
	f.Add(int64(2), "1", "0", int64(1))
	f.Add(int64(1), "1", "10", int64(10))
	f.Add(int64(1), "x", "0", int64(10))
	f.Add(int64(1), "9223372036854775808", "0", int64(10))
	f.Add(int64(1), "1", "-1", int64(10))
	f.Fuzz(func(t *testing.T, poured int64, tat, frac string, rate int64) {
		st, ok, err := DecodeGCRAState(poured, tat, frac, rate)
		rt, e1 := strconv.ParseInt(tat, 10, 64)
		rf, e2 := strconv.ParseInt(frac, 10, 64)
		wantOK := (poured == 0 || poured == 1) && e1 == nil && e2 == nil && rf >= 0 && rf < rate
		if (err == nil) != wantOK {
			t.Fatalf("DecodeGCRAState(%d, %q, %q, %d): got %+v, %v, %v; want ok %v", poured, tat, frac, rate, st, ok, err, wantOK)
		}
		if err == nil && (st.TAT != rt || st.Frac != rf || ok != (poured == 1)) {
			t.Fatalf("DecodeGCRAState(%d, %q, %q, %d): got %+v, %v; want {%d %d}, %v", poured, tat, frac, rate, st, ok, rt, rf, poured == 1)
		}
	})
}

// FuzzDecodeSlidingLog checks the decoding of the log script's reply and
// never panics.
func FuzzDecodeSlidingLog(f *testing.F) {
	f.Add(int64(1), int64(1), "1700000000000000000", "1700000060000000000", int64(5))
	f.Add(int64(0), int64(0), "", "never", int64(5))
	f.Add(int64(0), int64(3), "", "5", int64(5))
	f.Add(int64(1), int64(-1), "1", "1", int64(5))
	f.Add(int64(1), int64(2), "1", "-1", int64(1))
	f.Fuzz(func(t *testing.T, logged, count int64, oldest, release string, limit int64) {
		r, err := DecodeSlidingLog(logged, count, oldest, release, limit)
		if err != nil {
			return
		}
		if logged != 0 && logged != 1 || count < 0 || (oldest == "") != (count == 0) {
			t.Fatalf("DecodeSlidingLog(%d, %d, %q, %q): accepted %+v", logged, count, oldest, release, r)
		}
		if release == "never" && r.ReleaseAt != math.MaxInt64 || r.Remaining < 0 || r.Count != count {
			t.Fatalf("DecodeSlidingLog(%d, %d, %q, %q): got %+v", logged, count, oldest, release, r)
		}
	})
}

// luaDecimal is what the scripts' parse accepts (within int64), luaSeq
// what the log script takes for its member counter.
var (
	luaDecimal = regexp.MustCompile(`^-?[0-9]{1,19}$`)
	luaSeq     = regexp.MustCompile(`^[0-9]{1,15}$`)
)

// FuzzStoredState writes arbitrary bytes into the fields of a bucket and
// of a log's bookkeeping on a real redis-server and runs the scripts over
// them: a state the scripts' own decimal parser accepts (a "-" and at most
// 19 digits, within int64, as strconv.ParseInt) runs, anything else fails
// that call alone with ErrBadValue. No other error, and the server keeps
// answering.
func FuzzStoredState(f *testing.F) {
	p := startRedis(f)
	s, _ := newStore(f, Config{Addrs: []string{p.Addr}, Timeout: 2 * time.Second, ConnTimeout: 5 * time.Second})
	c := rawClient(f, p.Addr)
	for _, in := range [][3]string{
		{"1700000000000000000", "3", "0"}, {"-1", "0", "1"}, {"12x", "0", "0"}, {"1", "-1", "1"},
		{"9223372036854775807", "9", "9"}, {"9223372036854775808", "0", "0"}, {"-9223372036854775808", "0", "0"},
		{"00000000000000000001", "0", "0"}, {"1.5", "0", "0"}, {"1e9", "0", "0"}, {"", "", ""}, {"\x00", "1", "1"},
		{" 1", "1", "1"}, {"-", "0", "0"}, {"0", "99999999999", "2"},
	} {
		f.Add(in[0], in[1], in[2])
	}
	ctx := context.Background()
	var key uint64
	f.Fuzz(func(t *testing.T, a, b, seq string) {
		key++
		valid := func(v string) bool {
			_, err := strconv.ParseInt(v, 10, 64)
			return luaDecimal.MatchString(v) && err == nil
		}
		bucket := string(AppendGCRAKey(nil, key))
		if err := c.Do(ctx, c.B().Hset().Key(bucket).FieldValue().FieldValue("tat", a).FieldValue("frac", b).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		params := GCRAParams{Rate: 10, Per: time.Second, Capacity: 5}
		_, err := s.GCRA(ctx, key, params, 1_700_000_000_000_000_000, 1, true)
		fb, _ := strconv.ParseInt(b, 10, 64)
		wantOK := valid(a) && valid(b) && fb >= 0
		if wantOK && err != nil || !wantOK && !errors.Is(err, ErrBadValue) {
			t.Fatalf("bucket {tat %q, frac %q}: got %v, want ok %v or ErrBadValue", a, b, err, wantOK)
		}

		meta := string(appendTag(nil, key)) + ":logm"
		if err := c.Do(ctx, c.B().Hset().Key(meta).FieldValue().FieldValue("e", a).FieldValue("t", b).FieldValue("s", seq).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		_, err = s.SlidingLog(ctx, key, SlidingLogParams{Limit: 3, Window: time.Minute}, 1_700_000_000_000_000_000, 1, true)
		seqOK := luaSeq.MatchString(seq)
		ea, _ := strconv.ParseInt(a, 10, 64)
		eb, _ := strconv.ParseInt(b, 10, 64)
		wantOK = valid(a) && valid(b) && seqOK && ea <= eb
		if wantOK && err != nil || !wantOK && !errors.Is(err, ErrBadValue) {
			t.Fatalf("log meta {e %q, t %q, s %q}: got %v, want ok %v or ErrBadValue", a, b, seq, err, wantOK)
		}
	})
}
