package rules

import (
	"errors"
	"strconv"
	"strings"

	"github.com/poplimit/poplimit/policy"
)

// Count says which responses spend a rule's units (count: in a rules
// file). A counting rule decides a request when it arrives, as every rule
// does, reserving its units then so that concurrent requests see them,
// and settles it when the response is known: the units are kept if the
// response counts, given back if not. The zero Count counts every
// admitted request, as a rule without count does.
type Count struct {
	// codes holds the counted status codes 100 to 599, one bit each
	// (status: a list of codes and classes such as 4xx); all zero with a
	// cost header alone: every response counts.
	codes [10]uint64
	// CostHeader names the origin's response header that gives the units
	// a request costs (cost_header), 0 allowed; absent or malformed: the
	// rule's cost; capped at its limit.
	CostHeader string
	on         bool
	byStatus   bool
}

// On reports whether the rule counts by response.
func (c *Count) On() bool { return c.on }

// Counts reports whether a response of the given status spends the
// request's units: true for every status when the rule counts by its
// cost header alone, or does not count by response at all.
func (c *Count) Counts(status int) bool {
	if !c.byStatus {
		return true
	}
	if status < 100 || status > 599 {
		return false
	}
	i := status - 100
	return c.codes[i/64]&(1<<(i%64)) != 0
}

// Units returns the units a counted response costs: the origin's header
// value v (present tells whether the response had the header), a whole
// number capped at limit, 0 allowed; cost when it is absent or not a
// whole number. Surrounding blanks are ignored.
func (c *Count) Units(v []byte, present bool, cost, limit uint64) uint64 {
	if !present {
		return cost
	}
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	if len(v) == 0 {
		return cost
	}
	var n uint64
	for _, b := range v {
		if b < '0' || b > '9' {
			return cost
		}
		if n > limit {
			continue // capped: the digits still have to be digits
		}
		n = n*10 + uint64(b-'0')
	}
	return min(n, limit)
}

func (c *Count) set(lo, hi int) {
	for s := lo; s <= hi; s++ {
		i := s - 100
		c.codes[i/64] |= 1 << (i % 64)
	}
}

// countYAML is count: in a rules file.
type countYAML struct {
	Status     *[]string `yaml:"status"`
	CostHeader string    `yaml:"cost_header"`
}

// maxCountStatus bounds count.status's entries.
const maxCountStatus = 64

// NewCount returns the Count of a count: block (status: a list of codes
// and classes, or nil when absent; costHeader: a header name, or empty),
// for files of other formats (package envoyconf); the error names each
// bad field under "count".
func NewCount(status *[]string, costHeader string) (Count, error) {
	var errs []error
	f := &fields{bad: func(path, value, reason string) {
		errs = append(errs, &FieldError{Path: strings.TrimPrefix(path, "."), Value: value, Reason: reason})
	}}
	var c Count
	c.parse(f, &countYAML{Status: status, CostHeader: costHeader})
	return c, errors.Join(errs...)
}

func parseCount(f *fields, y ruleYAML, r *Rule) {
	cy := y.Count
	if cy == nil {
		return
	}
	c := &r.Count
	c.parse(&fields{path: f.path, bad: func(path, value, reason string) { f.n++; f.bad(path, value, reason) }}, cy)
	switch {
	case r.Kind != Rate:
		f.fail("count", "", "applies only to rate rules: a "+r.Kind.String()+" rule's slot is given back when the response ends, whatever it says")
	case r.Action == policy.Delay:
		f.fail("count", "", "a queue (action: delay) cannot give units back: a request waits for its place behind the units before it, which a give-back would move under it")
	case y.Scope != "" && y.Scope != "pop":
		f.fail("count", "", "applies only to rules of scope: pop (the other PoPs' counts of a global rule are what its edges admitted, not what its origins answered)")
	}
}

func (c *Count) parse(f *fields, cy *countYAML) {
	c.on = true
	if cy.Status == nil && cy.CostHeader == "" {
		f.fail("count", "", "needs status, cost_header or both")
	}
	if cy.Status != nil {
		c.byStatus = true
		switch st := *cy.Status; {
		case len(st) == 0:
			f.fail("count.status", "", "needs at least one status code or class")
		case len(st) > maxCountStatus:
			f.fail("count.status", strconv.Itoa(len(st))+" entries", "at most "+strconv.Itoa(maxCountStatus))
		default:
			for i, s := range st {
				lo, hi, ok := parseStatus(s)
				if !ok {
					f.fail("count.status["+strconv.Itoa(i)+"]", strconv.Quote(s), "must be a status code from 100 to 599 or a class 1xx to 5xx")
					continue
				}
				c.set(lo, hi)
			}
		}
	}
	if cy.CostHeader != "" {
		if !IsToken(cy.CostHeader) {
			f.fail("count.cost_header", strconv.Quote(cy.CostHeader), "is not a valid header name")
		}
		c.CostHeader = cy.CostHeader
	}
}

// parseStatus reads one entry of count.status: a code 100-599, or a
// class 1xx-5xx, as the range of codes it covers.
func parseStatus(s string) (lo, hi int, ok bool) {
	if len(s) != 3 || s[0] < '1' || s[0] > '5' {
		return 0, 0, false
	}
	if s[1:] == "xx" {
		lo = int(s[0]-'0') * 100
		return lo, lo + 99, true
	}
	if s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' {
		return 0, 0, false
	}
	n := int(s[0]-'0')*100 + int(s[1]-'0')*10 + int(s[2]-'0')
	return n, n, true
}
