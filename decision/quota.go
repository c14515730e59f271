package decision

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"time"
)

// The quota fields' names, in the canonical form of fasthttp and of the
// wire. RateLimit-Policy and RateLimit follow
// draft-ietf-httpapi-ratelimit-headers (-08 and later): each is a
// structured-field list whose item is the policy name as an sf-string with
// parameters q (quota) and w (window, seconds) for the policy, r
// (remaining) and t (seconds until the quota resets) for the current
// state. X-RateLimit-Reset is in Unix seconds, as GitHub's.
var (
	HeaderRateLimitPolicy = []byte("RateLimit-Policy")
	HeaderRateLimit       = []byte("RateLimit")
	HeaderXLimit          = []byte("X-RateLimit-Limit")
	HeaderXRemaining      = []byte("X-RateLimit-Remaining")
	HeaderXReset          = []byte("X-RateLimit-Reset")
	HeaderRetryAfter      = []byte("Retry-After")
)

// ContentTypeProblem is the media type of RFC 9457 problem bodies.
const ContentTypeProblem = "application/problem+json"

// FieldSetter takes a response's fields by canonical name, as
// *fasthttp.ResponseHeader's SetCanonical does; value is not kept.
type FieldSetter interface {
	SetCanonical(name, value []byte)
}

// SetFields sets every quota field of the answering rule on h, as of the
// request's time: the rule's fields rendered once per rules generation
// where its limit is the rule's own. A Verdict without a rule sets none.
// It does not allocate once h's and the Verdict's buffers have grown.
func (v *Verdict) SetFields(h FieldSetter) {
	if v.Quota.Rule != nil {
		v.buf = v.Quota.setFields(h, v.now.UnixNano(), v.buf)
	}
}

// setRefusal sets the fields of a refusal on h (the quota fields and
// Retry-After: the release, plus up to the core's jitter, see RetryAfter)
// and returns its RFC 9457 problem body in v's buffer.
func (v *Verdict) setRefusal(h FieldSetter) []byte {
	now := v.now.UnixNano()
	v.buf = v.Quota.setRefusal(h, now, RetryAfter(v.Quota.ReleaseAt, now, v.jitter), v.buf)
	return v.buf
}

// setRetryAfter sets Retry-After on h alone, for a shed request: the
// release, plus up to the core's jitter.
func (v *Verdict) setRetryAfter(h FieldSetter) {
	now := v.now.UnixNano()
	v.buf = strconv.AppendInt(v.buf[:0], RetryAfter(v.Quota.ReleaseAt, now, v.jitter), 10)
	h.SetCanonical(HeaderRetryAfter, v.buf)
}

// setFields sets every quota field of q at now (Unix ns) on h, using buf
// as scratch, and returns buf for reuse.
func (q *Quota) setFields(h FieldSetter, now int64, buf []byte) []byte {
	if f := q.fixed; f != nil && f.limit == q.Limit { // rendered once per rules (a tier's limit is not)
		h.SetCanonical(HeaderRateLimitPolicy, f.policy)
		h.SetCanonical(HeaderXLimit, f.xlimit)
	} else {
		buf = AppendPolicy(buf[:0], q)
		h.SetCanonical(HeaderRateLimitPolicy, buf)
		buf = strconv.AppendUint(buf[:0], q.Limit, 10)
		h.SetCanonical(HeaderXLimit, buf)
	}
	buf = AppendRateLimit(buf[:0], q, now)
	h.SetCanonical(HeaderRateLimit, buf)
	buf = strconv.AppendUint(buf[:0], q.Remaining, 10)
	h.SetCanonical(HeaderXRemaining, buf)
	buf = strconv.AppendInt(buf[:0], Seconds(time.Duration(q.ResetAt)), 10)
	h.SetCanonical(HeaderXReset, buf)
	return buf
}

// setRefusal sets the fields of a refusal by q at now on h: the quota
// fields and Retry-After, ra seconds; it returns the problem body in buf.
func (q *Quota) setRefusal(h FieldSetter, now, ra int64, buf []byte) []byte {
	buf = q.setFields(h, now, buf)
	buf = strconv.AppendInt(buf[:0], ra, 10)
	h.SetCanonical(HeaderRetryAfter, buf)
	if f := q.fixed; f != nil && f.limit == q.Limit {
		buf = append(buf[:0], f.problem...)
		buf = strconv.AppendInt(buf, ra, 10)
		return append(buf, '}')
	}
	return AppendQuotaProblem(buf[:0], q, ra)
}

// Status is the HTTP status that answers v, the same from every front
// end: 200 admitted, 429 limited, 503 shed, 400 denied (the request lacks
// what its rule needs); undecidable (DecideKey's) 404 when no rule has the
// name asked for, 422 when the rule cannot be decided by key alone.
func (v *Verdict) Status() int {
	switch v.Outcome {
	case Allowed:
		return 200
	case Limited:
		return 429
	case Shed:
		return 503
	case Undecidable:
		if v.Quota.Rule == nil {
			return 404
		}
		return 422
	}
	return 400
}

// Seconds returns d rounded up to whole seconds, at least 0: the unit of
// every quota field and of Retry-After.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// AppendPolicy appends q's RateLimit-Policy field value (see
// AppendPolicyItem).
func AppendPolicy(dst []byte, q *Quota) []byte {
	return AppendPolicyItem(dst, q.Rule.NameBytes(), q.Limit, q.Rule.Window)
}

// AppendPolicyItem appends a RateLimit-Policy item: the policy name as an
// sf-string (rule names need no escaping) with q (quota) and w (window,
// whole seconds rounded up).
func AppendPolicyItem(dst, name []byte, quota uint64, window time.Duration) []byte {
	return appendItem(dst, name, ";q=", quota, ";w=", Seconds(window))
}

// AppendRateLimit appends q's RateLimit field value at now (Unix ns), see
// AppendRateLimitItem.
func AppendRateLimit(dst []byte, q *Quota, now int64) []byte {
	return AppendRateLimitItem(dst, q.Rule.NameBytes(), q.Remaining, time.Duration(q.ResetAt-now))
}

// AppendRateLimitItem appends a RateLimit item: the policy name with r
// (remaining) and t (whole seconds until the quota resets, rounded up).
func AppendRateLimitItem(dst, name []byte, remaining uint64, untilReset time.Duration) []byte {
	return appendItem(dst, name, ";r=", remaining, ";t=", Seconds(untilReset))
}

// appendItem appends a structured-field list item of the ratelimit
// headers: the policy name as an sf-string (rule names need no escaping)
// and two integer parameters, a and b, each with its ";key=".
func appendItem(dst, name []byte, ka string, a uint64, kb string, b int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, '"')
	dst = append(dst, ka...)
	dst = strconv.AppendUint(dst, a, 10)
	dst = append(dst, kb...)
	return strconv.AppendInt(dst, b, 10)
}

// RetryAfter returns the Retry-After seconds for a refusal released at
// releaseAt (Unix ns): never before the release, plus up to jitter so
// refused clients spread their retries.
func RetryAfter(releaseAt, now int64, jitter time.Duration) int64 {
	s := Seconds(time.Duration(releaseAt - now))
	if j := int64(jitter / time.Second); j > 0 {
		s += rand.Int64N(j + 1)
	}
	return max(s, 1)
}

// AppendQuotaProblem appends the RFC 9457 problem body of a refusal by
// q's rule whose Retry-After is ra seconds.
func AppendQuotaProblem(dst []byte, q *Quota, ra int64) []byte {
	dst = appendProblemHead(dst, q)
	dst = strconv.AppendInt(dst, ra, 10)
	return append(dst, '}')
}

// appendProblemHead appends the problem body up to its retry_after value:
// all that depends on the rule and its limit only.
func appendProblemHead(dst []byte, q *Quota) []byte {
	dst = append(dst, `{"type":"https://poplimit.dev/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"rate limit `...)
	dst = append(dst, q.Rule.NameBytes()...)
	dst = append(dst, ` exceeded: at most `...)
	dst = strconv.AppendUint(dst, q.Limit, 10)
	dst = append(dst, ` per `...)
	dst = strconv.AppendInt(dst, Seconds(q.Rule.Window), 10)
	dst = append(dst, ` s","policy":"`...)
	dst = append(dst, q.Rule.NameBytes()...) // rule names are [A-Za-z0-9-_.:/]: no escaping needed
	dst = append(dst, `","limit":`...)
	dst = strconv.AppendUint(dst, q.Limit, 10)
	return append(dst, `,"retry_after":`...)
}

// HostOnly returns host as rules match it: without its port and brackets,
// and without one trailing dot. A fully qualified name ends in a dot
// (api.example.com.) and names the same host as the name without it; DNS
// resolves both and proxies route both to one server, so both must meet
// the same rules. Rules compare hosts under ASCII case folding. It slices
// h and does not allocate.
func HostOnly(h []byte) []byte {
	if i := bytes.LastIndexByte(h, ':'); i >= 0 && bytes.IndexByte(h[i:], ']') < 0 {
		h = h[:i]
	}
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	if len(h) > 1 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	return h
}
