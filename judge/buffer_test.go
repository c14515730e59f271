package judge

import (
	"math/rand/v2"
	"testing"
)

// TestBufferOrder: pushes and pops interleaved at random, with many equal
// times, come out in (t, seq) order, each event whole, and the slab's slots
// are reused rather than grown past the most buffered at once.
func TestBufferOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var b buffer
	var seq uint64
	var last hkey
	most, popped := 0, 0
	for step := range 200_000 {
		if b.len() == 0 || rng.IntN(100) < 55 {
			seq++
			// Times in a moving range, so later pushes can be earlier
			// than what is buffered, never earlier than what was popped.
			tm := int64(step/4) + int64(rng.IntN(50))
			if tm < last.t {
				tm = last.t
			}
			b.push(pending{t: tm, seq: seq, hash: seq * 7})
			most = max(most, b.len())
			continue
		}
		m := *b.min()
		p := b.pop()
		if p != m {
			t.Fatalf("pop %+v, min said %+v", p, m)
		}
		k := hkey{t: p.t, seq: p.seq}
		if popped > 0 && before(&k, &last) {
			t.Fatalf("popped (%d, %d) after (%d, %d)", p.t, p.seq, last.t, last.seq)
		}
		if p.hash != p.seq*7 {
			t.Fatalf("event %d came back as another's: hash %d", p.seq, p.hash)
		}
		last = k
		popped++
	}
	for b.len() > 0 {
		p := b.pop()
		k := hkey{t: p.t, seq: p.seq}
		if before(&k, &last) {
			t.Fatalf("draining: popped (%d, %d) after (%d, %d)", p.t, p.seq, last.t, last.seq)
		}
		last = k
	}
	if len(b.slab) > most {
		t.Errorf("slab of %d slots for at most %d buffered", len(b.slab), most)
	}
}
