package redisstore

import (
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/redis/rueidis"
)

// luaInt64Probe runs one luaInt64 operation over pairs of decimal
// arguments: ARGV[1] names it, then a, b, a, b, ...
const luaInt64Probe = luaInt64 + `
local op = ARGV[1]
local out = {}
for i = 2, #ARGV, 2 do
  local ah, al = parse(ARGV[i])
  local bh, bl = parse(ARGV[i + 1])
  local r
  if op == 'parse' then
    if ah then r = fmt(ah, al) else r = 'nil' end
  elseif op == 'add' then r = fmt(add(ah, al, bh, bl))
  elseif op == 'sub' then r = fmt(sub(ah, al, bh, bl))
  elseif op == 'lt' then if lt(ah, al, bh, bl) then r = '1' else r = '0' end
  elseif op == 'mul' then
    local h, l = mul(ah, al, bh, bl)
    if h >= SATH then r = 'sat' else r = fmt(h, l) end
  elseif op == 'divmod' then
    local qh, ql, rh, rl = divmod(ah, al, bh, bl)
    r = fmt(qh, ql) .. '/' .. fmt(rh, rl)
  end
  out[#out + 1] = r
end
return out
`

// rawClient connects a bare rueidis client to addr, closed at cleanup.
func rawClient(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// probe evaluates op over the pairs and returns one result per pair.
func probe(t *testing.T, c rueidis.Client, op string, pairs [][2]string) []string {
	t.Helper()
	args := []string{op}
	for _, p := range pairs {
		args = append(args, p[0], p[1])
	}
	got, err := c.Do(context.Background(), c.B().Eval().Script(luaInt64Probe).Numkeys(0).Arg(args...).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	if len(got) != len(pairs) {
		t.Fatalf("%s: got %d results, want %d", op, len(got), len(pairs))
	}
	return got
}

// randInt63 returns a non-negative int64 whose magnitude is spread over
// every bit length, and the limbs' edges (multiples of 10^9 and their
// neighbours) often.
func randInt63(r *rand.Rand) int64 {
	switch r.IntN(6) {
	case 0:
		return r.Int64N(1 << uint(1+r.IntN(62)))
	case 1:
		v := r.Int64N(9_223_372_036) * 1e9
		return v + int64(r.IntN(3)) - 1 + 1 // 0, 1 or 2 past a multiple
	case 2:
		return math.MaxInt64 - r.Int64N(1000)
	case 3:
		return r.Int64N(1 << 23)
	default:
		return r.Int64()
	}
}

// TestLuaInt64 checks the scripts' exact integer arithmetic against
// math/big on random operands across the whole int64 range: parse and fmt
// round trips, add, sub, lt, mul (exact below 4e19, "sat" above) and
// divmod (floor quotient and remainder), on a real redis-server.
func TestLuaInt64(t *testing.T) {
	c := rawClient(t, startRedis(t).Addr)
	r := rand.New(rand.NewPCG(1, 2))
	const n = 3000
	s := strconv.FormatInt
	b := func(v int64) *big.Int { return big.NewInt(v) }

	t.Run("parse", func(t *testing.T) {
		in := []string{"0", "-0", "1", "-1", "999999999", "1000000000", "-1000000000", "9223372036854775807",
			"-9223372036854775808", "9223372036854775808", "-9223372036854775809", "00000000000000000001",
			"0000000000000000001", "", "-", "+1", "1e3", " 1", "1 ", "12a", "99999999999999999999", "0x10"}
		for range 200 {
			v := r.Int64()
			if r.IntN(2) == 0 {
				v = -v
			}
			in = append(in, s(v, 10))
		}
		var pairs [][2]string
		for _, v := range in {
			pairs = append(pairs, [2]string{v, "0"})
		}
		got := probe(t, c, "parse", pairs)
		for i, v := range in {
			want := "nil"
			if len(v) <= 20 && v != "" && v[0] != '+' {
				if p, err := strconv.ParseInt(v, 10, 64); err == nil && len(trimSign(v)) <= 19 {
					want = s(p, 10)
				}
			}
			if got[i] != want {
				t.Errorf("parse(%q): got %s, want %s", v, got[i], want)
			}
		}
	})

	t.Run("add sub lt", func(t *testing.T) {
		var pairs [][2]string
		var as, bs []int64
		for range n {
			a, bb := randInt63(r)/2, randInt63(r)/2
			if r.IntN(2) == 0 {
				a = -a
			}
			if r.IntN(2) == 0 {
				bb = -bb
			}
			as, bs = append(as, a), append(bs, bb)
			pairs = append(pairs, [2]string{s(a, 10), s(bb, 10)})
		}
		adds, subs, lts := probe(t, c, "add", pairs), probe(t, c, "sub", pairs), probe(t, c, "lt", pairs)
		for i := range pairs {
			a, bb := as[i], bs[i]
			if want := s(a+bb, 10); adds[i] != want {
				t.Errorf("add(%d, %d): got %s, want %s", a, bb, adds[i], want)
			}
			if want := s(a-bb, 10); subs[i] != want {
				t.Errorf("sub(%d, %d): got %s, want %s", a, bb, subs[i], want)
			}
			want := "0"
			if a < bb {
				want = "1"
			}
			if lts[i] != want {
				t.Errorf("lt(%d, %d): got %s, want %s", a, bb, lts[i], want)
			}
		}
	})

	t.Run("mul", func(t *testing.T) {
		var pairs [][2]string
		var want []string
		lim, _ := new(big.Int).SetString("40000000000000000000", 10)
		for range n {
			a, bb := randInt63(r), randInt63(r)
			if r.IntN(3) == 0 { // products near the int64 range
				bb = math.MaxInt64 / max(a, 1) / int64(1+r.IntN(2))
			}
			pairs = append(pairs, [2]string{s(a, 10), s(bb, 10)})
			p := new(big.Int).Mul(b(a), b(bb))
			switch {
			case p.Cmp(lim) <= 0:
				want = append(want, p.String())
			default:
				want = append(want, "sat")
			}
		}
		got := probe(t, c, "mul", pairs)
		for i := range pairs {
			// Between 4e19 and a rounding error above it either answer is right.
			if got[i] != want[i] && !(got[i] == "sat" || want[i] == "sat") {
				t.Errorf("mul(%s, %s): got %s, want %s", pairs[i][0], pairs[i][1], got[i], want[i])
			}
			if (got[i] == "sat") != (want[i] == "sat") {
				p, _ := new(big.Int).SetString(pairs[i][0], 10)
				q, _ := new(big.Int).SetString(pairs[i][1], 10)
				p.Mul(p, q)
				d := new(big.Int).Sub(p, lim)
				if d.Abs(d).Cmp(big.NewInt(1<<20)) > 0 {
					t.Errorf("mul(%s, %s): got %s, want %s", pairs[i][0], pairs[i][1], got[i], want[i])
				}
			}
		}
	})

	t.Run("divmod", func(t *testing.T) {
		var pairs [][2]string
		for range n {
			a, d := randInt63(r), randInt63(r)
			if d == 0 {
				d = 1
			}
			if r.IntN(4) == 0 {
				d = 1 + r.Int64N(1<<24) // around the short-division bound
			}
			pairs = append(pairs, [2]string{s(a, 10), s(d, 10)})
		}
		pairs = append(pairs, [2]string{s(math.MaxInt64, 10), "1"}, [2]string{s(math.MaxInt64, 10), "8388607"},
			[2]string{s(math.MaxInt64, 10), "8388608"}, [2]string{s(math.MaxInt64, 10), s(math.MaxInt64, 10)},
			[2]string{s(math.MaxInt64-1, 10), s(math.MaxInt64, 10)}, [2]string{"0", "3"})
		got := probe(t, c, "divmod", pairs)
		for i, p := range pairs {
			a, _ := strconv.ParseInt(p[0], 10, 64)
			d, _ := strconv.ParseInt(p[1], 10, 64)
			if want := s(a/d, 10) + "/" + s(a%d, 10); got[i] != want {
				t.Errorf("divmod(%d, %d): got %s, want %s", a, d, got[i], want)
			}
		}
	})
}

func trimSign(s string) string {
	if len(s) > 0 && s[0] == '-' {
		return s[1:]
	}
	return s
}
