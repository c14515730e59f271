package decision

import (
	"net/netip"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/rules"
)

// Fields reads a request's header fields, query parameters and cookies for
// key recipes and cost headers. Each method returns the first and the last
// value of the field called name and n, how many times it appears: n = 0
// when absent (first and last nil), first and last the same value when
// n = 1. The core decides what a field that appears more than once means
// (the rule's duplicate_key), so a front end counts every occurrence:
//
//   - a header once per line (names compared under ASCII case folding),
//     its value the line's bytes without surrounding blanks;
//   - a query parameter once per name=value pair of the query (a bare name
//     counts, with an empty value), names and values percent-decoded, a
//     plus being a space;
//   - a cookie once per name=value pair of all the Cookie lines together
//     (a client or an HTTP/2 hop may split the one list into several
//     lines), names compared exactly, values as written but for
//     surrounding blanks and one pair of surrounding double quotes; a
//     pair whose value then holds '"', ';' or '\' is not a cookie.
//
// A front end implements it over its own request type without allocating
// (but to percent-decode); the returned bytes need only live until Decide
// returns.
type Fields interface {
	Header(name string) (first, last []byte, n int)
	Query(name string) (first, last []byte, n int)
	Cookie(name string) (first, last []byte, n int)
}

// Request is what the core needs to know of one request. A front end fills
// it from its own request type; nothing in it is kept after Decide returns.
type Request struct {
	Host   []byte // without port, as rules match it
	Method []byte
	Path   []byte     // after any check prefix, without the query
	Addr   netip.Addr // the client, as resolved from trusted proxies
	Fields Fields     // nil: the request has no headers, query or cookies
	Now    time.Time
	// Tracked says the front end sees the response complete and calls
	// Finish then: concurrency rules apply only to tracked requests (in
	// decision mode the edge never sees the upstream's response).
	Tracked bool
}

// Outcome is the core's answer to one request.
type Outcome uint8

const (
	// Allowed: forward or answer 200. No rule applied when Quota.Rule is nil.
	Allowed Outcome = iota
	// Limited: answer 429 with Retry-After from Quota.ReleaseAt.
	Limited
	// Denied: answer 400 with Reason: the request lacks the key its rule
	// needs (missing_key: deny), carries a field of the key more than once
	// (duplicate_key: refuse) or carries a bad cost.
	Denied
	// Shed: the upstream is overloaded and this class of request is shed;
	// answer 503 with Retry-After from Quota.ReleaseAt.
	Shed
	// Undecidable: the rule asked for cannot be decided by this call (a
	// concurrency or shed rule through DecideKey); answer with Reason.
	Undecidable
)

var outcomeNames = [...]string{"allowed", "limited", "denied", "shed", "undecidable"}

func (o Outcome) String() string { return outcomeNames[o] }

// Quota is what the response headers of one request say: the state of the
// rule that answers it (the refusing rule, or the allowing rule with the
// least remaining).
type Quota struct {
	Rule      *rules.Rule // nil when no rule applied
	Limit     uint64
	Remaining uint64
	ResetAt   int64 // Unix ns: when the rule's current window ends
	ReleaseAt int64 // Unix ns, refusals only: when a request of this cost fits again

	fixed *fixedFields // the rule's header values rendered once; nil: render them
}

// fixedFields are the header values of a rule that do not change from
// request to request at its own limit, rendered once per generation of
// rules: RateLimit-Policy, X-RateLimit-Limit and most of the problem body.
type fixedFields struct {
	limit   uint64 // what they were rendered for
	policy  []byte
	xlimit  []byte
	problem []byte // the refusal's problem body up to its retry_after value
}

// Verdict is the core's verdict on one request and the working space that
// produced it. Decide returns one from a pool; the front end reads it,
// answers, and hands it back with Finish, after the response completed
// when the request was Tracked. A Verdict is not safe for concurrent use.
type Verdict struct {
	Outcome Outcome
	Quota   Quota
	Reason  string // for Denied and Undecidable: a sentence for the problem detail
	// FromBlockCache says a refusal was answered from the block cache;
	// Fallback that a store failure decided (the rule's fail policy).
	FromBlockCache, Fallback bool
	// Delay is how long a leaky-bucket queue (action: delay) held the
	// admitted request before the core answered.
	Delay time.Duration

	key  []byte
	ev   event.Event
	held [maxHeld]heldSlot
	nh   int
	// pend are the units counting rules reserved (settle.go).
	pend   [maxPending]pendingUnits
	np     int
	now    time.Time
	jitter time.Duration // the core's RetryJitter; 0: none
	buf    []byte        // rendering room, kept with the pooled Verdict
}

// Key returns the key material of the answering rule's key (valid until
// Finish), for reports.
func (d *Verdict) Key() []byte { return d.key }

// maxHeld bounds the concurrency slots one request can hold.
const maxHeld = 4

type heldSlot struct {
	rule *rules.Rule
	key  uint64
}
