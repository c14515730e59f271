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

// SetRefusal sets the fields of a refusal on h (the quota fields and
// Retry-After: the release, plus up to jitter, see RetryAfter) and returns
// its RFC 9457 problem body, for the front end to send with
// ContentTypeProblem; the body is the Verdict's and valid until Finish.
func (v *Verdict) SetRefusal(h FieldSetter, jitter time.Duration) []byte {
	now := v.now.UnixNano()
	v.buf = v.Quota.setRefusal(h, now, RetryAfter(v.Quota.ReleaseAt, now, jitter), v.buf)
	return v.buf
}

// SetRetryAfter sets Retry-After on h alone, for a shed request: the
// release, plus up to jitter.
func (v *Verdict) SetRetryAfter(h FieldSetter, jitter time.Duration) {
	now := v.now.UnixNano()
	v.buf = strconv.AppendInt(v.buf[:0], RetryAfter(v.Quota.ReleaseAt, now, jitter), 10)
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
	buf = strconv.AppendInt(buf[:0], ceilSeconds(q.ResetAt), 10)
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
	return AppendProblem(buf[:0], q, ra)
}

// Status is the HTTP status that answers v: 200 admitted, 429 limited,
// 503 shed, 400 denied or undecidable (the request lacks what its rule
// needs).
func (v *Verdict) Status() int {
	switch v.Outcome {
	case Allowed:
		return 200
	case Limited:
		return 429
	case Shed:
		return 503
	}
	return 400
}

// ceilSeconds returns d rounded up to whole seconds, at least 0.
func ceilSeconds(d int64) int64 {
	if d <= 0 {
		return 0
	}
	return (d + int64(time.Second) - 1) / int64(time.Second)
}

// AppendPolicy appends q's RateLimit-Policy field value: the policy name
// as an sf-string with q (quota) and w (window, seconds).
func AppendPolicy(dst []byte, q *Quota) []byte {
	dst = append(dst, '"')
	dst = append(dst, q.Rule.NameBytes()...)
	dst = append(dst, `";q=`...)
	dst = strconv.AppendUint(dst, q.Limit, 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, ceilSeconds(int64(q.Rule.Window)), 10)
}

// AppendRateLimit appends q's RateLimit field value at now (Unix ns): the
// policy name with r (remaining) and t (seconds until the quota resets).
func AppendRateLimit(dst []byte, q *Quota, now int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, q.Rule.NameBytes()...)
	dst = append(dst, `";r=`...)
	dst = strconv.AppendUint(dst, q.Remaining, 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, ceilSeconds(q.ResetAt-now), 10)
}

// RetryAfter returns the Retry-After seconds for a refusal released at
// releaseAt (Unix ns): never before the release, plus up to jitter so
// refused clients spread their retries.
func RetryAfter(releaseAt, now int64, jitter time.Duration) int64 {
	s := ceilSeconds(releaseAt - now)
	if j := int64(jitter / time.Second); j > 0 {
		s += rand.Int64N(j + 1)
	}
	return max(s, 1)
}

// AppendProblem appends the RFC 9457 problem body of a refusal by q's rule
// whose Retry-After is ra seconds.
func AppendProblem(dst []byte, q *Quota, ra int64) []byte {
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
	dst = strconv.AppendInt(dst, ceilSeconds(int64(q.Rule.Window)), 10)
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
