package judge

import (
	"cmp"
	"slices"
)

// wrongKey is what is remembered of a key with wrong decisions.
type wrongKey struct {
	id    keyID
	limit uint32  // the limit of its latest wrong decision
	n     int64   // wrong decisions
	ratio float64 // the worst exact/limit: the largest (false negatives) or smallest (false positives)
}

// wrongKeys is a bounded set of the keys with wrong decisions of one kind.
// Past max keys it keeps the more severe half, so the most severe keys
// survive and the distinct count becomes an upper bound.
type wrongKeys struct {
	max       int
	high      bool // a larger ratio is worse (false negatives)
	m         map[keyID]*wrongKey
	distinct  int64 // keys added; exact unless truncated
	truncated bool
}

func newWrongKeys(max int, high bool) wrongKeys {
	return wrongKeys{max: max, high: high, m: make(map[keyID]*wrongKey)}
}

// note records one wrong decision of key id.
func (w *wrongKeys) note(id keyID, limit uint32, ratio float64) {
	k := w.m[id]
	if k == nil {
		if len(w.m) >= w.max {
			w.compact()
		}
		k = &wrongKey{id: id, ratio: ratio}
		w.m[id] = k
		w.distinct++
	}
	k.n++
	k.limit = limit
	if w.worse(ratio, k.ratio) {
		k.ratio = ratio
	}
}

func (w *wrongKeys) worse(a, b float64) bool {
	if w.high {
		return a > b
	}
	return a < b
}

// sorted returns the keys, most severe first: by ratio, then by count of
// wrong decisions, then by key.
func (w *wrongKeys) sorted() []*wrongKey {
	ks := make([]*wrongKey, 0, len(w.m))
	for _, k := range w.m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b *wrongKey) int {
		if a.ratio != b.ratio {
			if w.worse(a.ratio, b.ratio) {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		if c := cmp.Compare(a.id.hash, b.id.hash); c != 0 {
			return c
		}
		return cmp.Compare(a.id.rule, b.id.rule)
	})
	return ks
}

// compact drops the less severe half of the keys.
func (w *wrongKeys) compact() {
	ks := w.sorted()
	for _, k := range ks[len(ks)/2:] {
		delete(w.m, k.id)
	}
	w.truncated = true
}
