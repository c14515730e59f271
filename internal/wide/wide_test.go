package wide

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func toBig(x U128) *big.Int {
	b := new(big.Int).SetUint64(x.Hi)
	b.Lsh(b, 64)
	return b.Or(b, new(big.Int).SetUint64(x.Lo))
}

// Every operation agrees with math/big on random operands, Div saturating
// to 64 bits where the quotient does not fit.
func TestMatchesBig(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	max64 := new(big.Int).SetUint64(math.MaxUint64)
	for range 10_000 {
		a, b, d := rng.Uint64(), rng.Uint64()>>rng.IntN(64), max(1, rng.Uint64()>>rng.IntN(64))
		p, q := Mul(a, b), Mul(b>>1, a>>1)
		bp, bq := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b)), toBig(q)
		if toBig(p).Cmp(bp) != 0 {
			t.Fatalf("Mul(%d, %d) = %v, want %v", a, b, toBig(p), bp)
		}
		if got, want := LE(p, q), bp.Cmp(bq) <= 0; got != want {
			t.Fatalf("LE(%v, %v) = %v", bp, bq, got)
		}
		if sum := new(big.Int).Add(bp, bq); sum.BitLen() <= 128 && toBig(Add(p, q)).Cmp(sum) != 0 {
			t.Fatalf("Add(%v, %v) = %v, want %v", bp, bq, toBig(Add(p, q)), sum)
		}
		want := new(big.Int).Quo(bp, new(big.Int).SetUint64(d))
		if want.Cmp(max64) > 0 {
			want = max64
		}
		if got := Div(p, d); got != want.Uint64() {
			t.Fatalf("Div(%v, %d) = %d, want %v", bp, d, got, want)
		}
		if x := Mul(a>>32, b>>32); true {
			m := uint64(rng.Uint32())
			if got, want := toBig(MulX(x, m)), new(big.Int).Mul(toBig(x), new(big.Int).SetUint64(m)); got.Cmp(want) != 0 {
				t.Fatalf("MulX(%v, %d) = %v, want %v", toBig(x), m, got, want)
			}
		}
		if f, _ := new(big.Float).SetInt(bp).Float64(); math.Abs(Float(p)-f) > f*1e-15 {
			t.Fatalf("Float(%v) = %g, want %g", bp, Float(p), f)
		}
	}
}
