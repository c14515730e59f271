package judge

import "github.com/poplimit/poplimit/algo"

// keyID identifies a key: its hash and its rule (the hash already mixes in
// the rule; the rule keeps two rules' keys apart all the same), and, for a
// rule of scope pop, its PoP: the limit holds in each PoP apart. A global
// rule's key is one across PoPs (pop allPops).
type keyID struct {
	hash uint64
	rule uint32
	pop  uint16
}

// allPops is the pop of a global rule's keyID.
const allPops = 0xffff

// keyState is one key's exact history, in the reference of its kind (its
// algorithm's): admitted units (allowed decisions) and attempted units
// (every decision). Block keys use attempts only.
type keyState struct {
	id       keyID
	admitted algo.SlidingLogState // refLog: units of allowed decisions
	attempts algo.SlidingLogState // refLog: units of every decision
	last     int64                // latest event time judged, Unix ns
	entries  int32                // log entries as last accounted
	slots    int32                // log ring slots (entries of room) as last accounted
	prev     int32                // neighbours on its list, -1: none
	next     int32
	list     int32       // index into keyTable.lists
	kind     uint8       // the reference kept: refLog, refBucket or refFixed
	bucket   [2]gcra     // refBucket: admitted, attempts
	fixed    fixedCounts // refFixed
}

// reset empties key i's references and makes them of kind: the key's rule
// changed algorithm, and the new one is judged from scratch.
func (kt *keyTable) reset(i int32, kind uint8) {
	st := &kt.slab[i]
	st.admitted, st.attempts = algo.SlidingLogState{}, algo.SlidingLogState{}
	st.bucket, st.fixed = [2]gcra{}, fixedCounts{}
	st.kind = kind
	kt.account(i)
}

// wlist is the list of the keys of one span (the window, or the drain time
// of a bucket when that is longer: see span), least recently active
// first. Events are judged in time order (late ones do not move their key),
// so appending a key when it is judged keeps each list ordered by last: the
// head is the first to expire, and among the heads the oldest is the least
// recently active key.
type wlist struct {
	window     int64 // the span, ns
	head, tail int32
}

// keyTable holds the keys' states in a slab addressed by index, so that the
// map and the lists hold no pointers.
type keyTable struct {
	index     map[keyID]int32
	slab      []keyState
	free      []int32
	lists     []wlist         // a list with head -1 is free
	listIndex map[int64]int32 // span → its list
	freeLists []int32
	entries   int // log entries, all keys
	slots     int // log ring slots, all keys: the logs' memory, 16 bytes each
	most      int // keys at most (Config.MaxKeys): the slab never grows past it
}

func newKeyTable(most int) keyTable {
	return keyTable{index: make(map[keyID]int32), listIndex: make(map[int64]int32), most: most}
}

func (kt *keyTable) len() int { return len(kt.index) }

// listFor returns the index of the list of keys with span w, adding it.
// An empty list is freed (see unlink), so there are never more lists than
// keys, nor more than distinct spans among them.
func (kt *keyTable) listFor(w int64) int32 {
	if l, ok := kt.listIndex[w]; ok {
		return l
	}
	var l int32
	if n := len(kt.freeLists); n > 0 {
		l = kt.freeLists[n-1]
		kt.freeLists = kt.freeLists[:n-1]
	} else {
		kt.lists = append(kt.lists, wlist{})
		l = int32(len(kt.lists) - 1)
	}
	kt.lists[l] = wlist{window: w, head: -1, tail: -1}
	kt.listIndex[w] = l
	return l
}

// add creates the state of id, with references of kind, on the list of span
// w, as the most recently active, and returns its index.
func (kt *keyTable) add(id keyID, kind uint8, w, t int64) int32 {
	var i int32
	if n := len(kt.free); n > 0 {
		i = kt.free[n-1]
		kt.free = kt.free[:n-1]
	} else {
		kt.slab = appendCapped(kt.slab, keyState{}, kt.most)
		i = int32(len(kt.slab) - 1)
	}
	kt.slab[i] = keyState{id: id, last: t, prev: -1, next: -1, kind: kind}
	kt.index[id] = i
	kt.pushBack(i, kt.listFor(w))
	return i
}

// touch records that key i was judged at t under span w: it becomes the
// most recently active of its span's list.
func (kt *keyTable) touch(i int32, w, t int64) {
	st := &kt.slab[i]
	st.last = t
	l := st.list
	if kt.lists[l].window != w {
		kt.unlink(i)
		kt.pushBack(i, kt.listFor(w))
		return
	}
	if kt.lists[l].tail == i {
		return
	}
	kt.unlink(i)
	kt.pushBack(i, l)
}

func (kt *keyTable) pushBack(i, l int32) {
	st := &kt.slab[i]
	lst := &kt.lists[l]
	st.list, st.prev, st.next = l, lst.tail, -1
	if lst.tail >= 0 {
		kt.slab[lst.tail].next = i
	} else {
		lst.head = i
	}
	lst.tail = i
}

func (kt *keyTable) unlink(i int32) {
	st := &kt.slab[i]
	lst := &kt.lists[st.list]
	if st.prev >= 0 {
		kt.slab[st.prev].next = st.next
	} else {
		lst.head = st.next
	}
	if st.next >= 0 {
		kt.slab[st.next].prev = st.prev
	} else {
		lst.tail = st.prev
	}
	st.prev, st.next = -1, -1
	if lst.head < 0 {
		delete(kt.listIndex, lst.window)
		kt.freeLists = append(kt.freeLists, st.list)
	}
}

// remove deletes key i and frees its logs.
func (kt *keyTable) remove(i int32) {
	kt.unlink(i)
	st := &kt.slab[i]
	kt.entries -= int(st.entries)
	kt.slots -= int(st.slots)
	delete(kt.index, st.id)
	*st = keyState{}
	kt.free = append(kt.free, i)
}

// account brings the entry and slot totals up to date with key i's logs.
func (kt *keyTable) account(i int32) {
	st := &kt.slab[i]
	n := int32(st.admitted.Len() + st.attempts.Len())
	kt.entries += int(n - st.entries)
	st.entries = n
	c := int32(st.admitted.Cap() + st.attempts.Cap())
	kt.slots += int(c - st.slots)
	st.slots = c
}

// appendCapped appends v to s, growing it (when full) to twice its length
// but never to more than most elements, or len(s)+1 if that is more (most
// 0: append's own growth). append's own growth would leave up to a quarter
// of a large slice unused, past the bound its memory is documented by.
func appendCapped[T any](s []T, v T, most int) []T {
	if len(s) < cap(s) || most <= 0 {
		return append(s, v)
	}
	n := max(min(2*len(s), most), len(s)+1, min(16, most))
	g := make([]T, len(s), n)
	copy(g, s)
	return append(g, v)
}

// oldest returns the least recently active key other than except, or -1.
func (kt *keyTable) oldest(except int32) int32 {
	best := int32(-1)
	for l := range kt.lists {
		i := kt.lists[l].head
		if i == except && i >= 0 {
			i = kt.slab[i].next
		}
		if i >= 0 && (best < 0 || kt.slab[i].last < kt.slab[best].last) {
			best = i
		}
	}
	return best
}
