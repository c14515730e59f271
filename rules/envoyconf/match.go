package envoyconf

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/poplimit/poplimit/policy"
)

// node is one descriptor of the tree: its children by composite key ("key"
// or "key_value") and its wildcard children in file order.
type node struct {
	children      map[string]*node
	wild          []wildcard
	limit         *Limit
	finalKey      string // the composite key this node is stored under
	valueToMetric bool
	share         bool // share_threshold on a composite key with '*'
	line          int
}

// wildcard is a child whose composite key holds '*': each '*' matches any
// run of bytes, including none (ratelimit's wildcardMatch).
type wildcard struct {
	parts []string // the composite key split on '*'
	fixed int      // total length of parts
	node  *node
}

func newWildcard(pattern string, n *node) wildcard {
	w := wildcard{parts: strings.Split(pattern, "*"), node: n}
	for _, p := range w.parts {
		w.fixed += len(p)
	}
	return w
}

// match reports whether s matches: it starts with the first part, ends
// with the last, and holds the middle parts in order, without overlap.
func (w *wildcard) match(s string) bool {
	parts := w.parts
	if len(parts) == 1 {
		return parts[0] == s
	}
	last := parts[len(parts)-1]
	if len(s) < w.fixed || !strings.HasPrefix(s, parts[0]) || !strings.HasSuffix(s, last) {
		return false
	}
	rest := s[len(parts[0]) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// How one entry of a request matched its level of the tree.
const (
	byValue    uint8 = iota + 1 // "key_value" found as is
	byWildcard                  // "key_value" matched a wildcard child
	byKey                       // only "key" found: the descriptor without a value
)

type step struct {
	n   *node
	how uint8
}

// inlineSteps is the depth a Match holds without allocating.
const inlineSteps = 8

// compositeBuf is the length of "key_value" Lookup builds without
// allocating.
const compositeBuf = 256

// Match is the answer of Lookup for one descriptor: the Limit that applies
// (nil when none does) and what the request's keys need from the walk that
// found it. It refers to the entries it was looked up with: keep them
// unchanged while the Match is used. The zero value matches nothing.
type Match struct {
	// Limit is the rate limit that applies; nil when none does. It may be
	// Unlimited. Shared and read only.
	Limit *Limit

	domain   string
	entries  []Entry
	n        int // steps recorded
	steps    [inlineSteps]step
	more     []step
	override bool
}

func (m *Match) push(s step) {
	if m.n < inlineSteps {
		m.steps[m.n] = s
	} else {
		m.more = append(m.more, s)
	}
	m.n++
}

func (m *Match) step(i int) step {
	if i < inlineSteps {
		return m.steps[i]
	}
	return m.more[i-inlineSteps]
}

// Found reports whether a Limit applies.
func (m *Match) Found() bool { return m.Limit != nil }

// Lookup returns the rate limit that applies to one descriptor of a
// request to domain, chosen as envoyproxy/ratelimit chooses it
// (src/config/config_impl.go GetLimit): the entries are walked one level of
// the tree each; at each level "key_value" is looked up first, then the
// wildcard children in file order, then "key" alone; a level without a match
// ends the walk with no limit; the limit is that of the node the last entry
// reached, so a request with more entries than the tree is deep, or fewer
// than the depth where the limit sits, gets none. An unknown domain or a
// descriptor without entries gets none.
//
// Lookup does not allocate while every "key_value" is at most 256 bytes and
// the descriptor has at most 8 entries. It is safe for concurrent use.
func (c *Config) Lookup(domain string, entries []Entry) Match {
	var m Match
	if c == nil {
		return m
	}
	d := c.domains[domain]
	if d == nil || len(entries) == 0 {
		return m
	}
	var buf [compositeBuf]byte
	cur := &d.root
	last := len(entries) - 1
	for i := range entries {
		e := &entries[i]
		b := append(buf[:0], e.Key...)
		b = append(b, '_')
		b = append(b, e.Value...)
		// A view of b, used only before b changes: map lookups and
		// comparisons, never stored.
		composite := unsafe.String(unsafe.SliceData(b), len(b))

		how := byValue
		next := cur.children[composite]
		if next == nil && len(cur.wild) > 0 {
			for j := range cur.wild {
				if cur.wild[j].match(composite) {
					next, how = cur.wild[j].node, byWildcard
					break
				}
			}
		}
		if next == nil {
			next, how = cur.children[e.Key], byKey
		}
		if next == nil {
			return Match{}
		}
		m.push(step{next, how})
		if i == last {
			m.Limit = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		cur = next
	}
	if m.Limit == nil {
		return Match{}
	}
	m.domain = d.name
	m.entries = entries
	return m
}

// Override returns the Match of a descriptor that carries its own limit
// (RateLimitDescriptor.limit): requests_per_unit per unit, never shadowed,
// unnamed, replacing nothing, with the poplimit defaults of the domain's
// first file; its keys are the request's entries as they are. As in
// ratelimit, an unknown domain gets no limit even with an override. unit is
// the protobuf number of envoy.type.v3.RateLimitUnit (the same numbers as
// Unit); an unknown unit is an error (ratelimit panics on it). Override
// allocates its Limit.
func (c *Config) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) (Match, error) {
	if !c.HasDomain(domain) {
		return Match{}, nil
	}
	if unit.Seconds() == 0 {
		return Match{}, fmt.Errorf("envoyconf: override %s: rate limit unit %v: %w", domain, unit, ErrInvalid)
	}
	d := c.domains[domain]
	l := &Limit{
		Domain:          domain,
		FullKey:         string(appendDescriptorKey(nil, domain, entries)),
		RequestsPerUnit: requestsPerUnit,
		Unit:            unit,
		Window:          time.Duration(unit.Seconds()) * time.Second,
		Algorithm:       d.defaults.algorithm,
		Mode:            d.defaults.mode,
		Action:          d.defaults.action,
		Fail:            d.defaults.fail,
	}
	if l.Algorithm.IsBucket() {
		l.Burst = uint64(requestsPerUnit)
	}
	if l.Action == policy.Block && !d.defaults.count {
		l.Timeout = l.Window
	}
	return Match{Limit: l, domain: d.name, entries: entries, override: true}, nil
}

// appendDescriptorKey writes ratelimit's key of an overridden descriptor:
// the domain, then each entry's "key" or "key_value", joined by dots.
func appendDescriptorKey(dst []byte, domain string, entries []Entry) []byte {
	dst = append(dst, domain...)
	dst = append(dst, '.')
	for i, e := range entries {
		if i > 0 {
			dst = append(dst, '.')
		}
		dst = append(dst, e.Key...)
		if e.Value != "" {
			dst = append(dst, '_')
			dst = append(dst, e.Value...)
		}
	}
	return dst
}

// sharePattern returns, for entry i, the wildcard value its counter is
// shared under: when the entry matched a wildcard descriptor with
// share_threshold, that descriptor's composite key without the entry's
// "key_" ("files/*").
func (m *Match) sharePattern(i int) (string, bool) {
	if i >= m.n {
		return "", false
	}
	s := m.step(i)
	if s.how != byWildcard || !s.n.share {
		return "", false
	}
	return trimKey(s.n.finalKey, m.entries[i].Key), true
}

// trimKey is strings.TrimPrefix(composite, key+"_") without building the
// prefix.
func trimKey(composite, key string) string {
	if len(composite) > len(key) && composite[len(key)] == '_' && composite[:len(key)] == key {
		return composite[len(key)+1:]
	}
	return composite
}

// AppendCounterKey appends the identity of the counter this request's
// descriptor counts against, as ratelimit's cache key is built
// (src/limiter/cache_key.go) without its prefix and window: the domain,
// then each entry's key and value, each followed by '_'
// ("messaging_to_number_2061111111_"). A value matched by a share_threshold
// wildcard is replaced by the wildcard ("example11_files_files/*_"), so all
// such values share one counter; otherwise every value counts apart, also
// those a key-only or wildcard descriptor matched. It appends nothing when
// no Limit applies. It does not allocate when dst has room.
func (m *Match) AppendCounterKey(dst []byte) []byte {
	if m.Limit == nil {
		return dst
	}
	dst = append(dst, m.domain...)
	dst = append(dst, '_')
	for i := range m.entries {
		e := &m.entries[i]
		dst = append(dst, e.Key...)
		dst = append(dst, '_')
		if p, ok := m.sharePattern(i); ok {
			dst = append(dst, p...)
		} else {
			dst = append(dst, e.Value...)
		}
		dst = append(dst, '_')
	}
	return dst
}

// AppendCacheKey appends ratelimit's whole cache key: prefix (its
// CACHE_KEY_PREFIX), the counter key, and the start of the aligned window
// that holds now (Limit.WindowStart) in Unix seconds; for a window of a
// fraction of a second, in Unix milliseconds followed by "ms". It appends
// nothing when no Limit applies or the Limit has no window.
func (m *Match) AppendCacheKey(dst []byte, prefix string, now time.Time) []byte {
	if m.Limit == nil || m.Limit.Window <= 0 {
		return dst
	}
	dst = append(dst, prefix...)
	dst = m.AppendCounterKey(dst)
	start := m.Limit.WindowStart(now)
	if m.Limit.Window%time.Second == 0 {
		return strconv.AppendInt(dst, start.Unix(), 10)
	}
	dst = strconv.AppendInt(dst, start.UnixMilli(), 10)
	return append(dst, "ms"...)
}

// AppendStatsKey appends the key ratelimit names this request's statistics
// by (its RateLimit.FullKey and Stats.Key after GetLimit): the domain and
// one part per entry, joined by dots. A part is the entry's "key_value"
// when matched by value, "key" when matched by key alone, and the wildcard
// ("key_foo*") when matched by a wildcard; value_to_metric puts the
// request's value in the last two cases; share_threshold keeps the
// wildcard over value_to_metric. With detailed_metric on the matched
// descriptor every part is "key_value" of the request (share_threshold
// entries keep their wildcard). It appends nothing when no Limit applies.
//
// Such keys are as many as the values requests send when value_to_metric or
// detailed_metric is set: never use them as metric labels unbounded.
func (m *Match) AppendStatsKey(dst []byte) []byte {
	if m.Limit == nil {
		return dst
	}
	if m.override {
		return appendDescriptorKey(dst, m.domain, m.entries)
	}
	dst = append(dst, m.domain...)
	if m.Limit.DetailedMetric {
		shared := false
		for i := range m.entries {
			if _, ok := m.sharePattern(i); ok {
				shared = true
				break
			}
		}
		for i := range m.entries {
			e := &m.entries[i]
			dst = append(dst, '.')
			dst = append(dst, e.Key...)
			if p, ok := m.sharePattern(i); ok {
				dst = append(dst, '_')
				dst = append(dst, p...)
			} else if !shared || e.Value != "" {
				dst = append(dst, '_')
				dst = append(dst, e.Value...)
			}
		}
		return dst
	}
	for i := range m.entries {
		e := &m.entries[i]
		s := m.step(i)
		var v string
		switch s.how {
		case byWildcard:
			if p, ok := m.sharePattern(i); ok {
				v = p
			} else if s.n.valueToMetric {
				v = e.Value
			} else {
				v = trimKey(s.n.finalKey, e.Key)
			}
		case byValue:
			v = e.Value
		case byKey:
			if s.n.valueToMetric {
				v = e.Value
			}
		}
		dst = append(dst, '.')
		dst = append(dst, e.Key...)
		if v != "" {
			dst = append(dst, '_')
			dst = append(dst, v...)
		}
	}
	return dst
}
