package edge

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The quota header names. RateLimit-Policy and RateLimit follow
// draft-ietf-httpapi-ratelimit-headers (-08 and later): each is a
// structured-field list whose item is the policy name as an sf-string with
// parameters q (quota) and w (window, seconds) for the policy, r (remaining)
// and t (seconds until the quota resets) for the current state.
var (
	hRateLimitPolicy = []byte("RateLimit-Policy")
	hRateLimit       = []byte("RateLimit")
	hXLimit          = []byte("X-RateLimit-Limit")
	hXRemaining      = []byte("X-RateLimit-Remaining")
	hXReset          = []byte("X-RateLimit-Reset")
	hRetryAfter      = []byte("Retry-After")
	ctProblem        = "application/problem+json"
)

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

// setQuotaHeaders writes the quota headers of q to the response, using buf
// as scratch; it returns buf for reuse. It does not allocate once the
// response's header buffers have grown.
func setQuotaHeaders(h *fasthttp.ResponseHeader, q *Quota, now int64, buf []byte) []byte {
	if f := q.fixed; f != nil && f.limit == q.Limit { // rendered once per rules (a tier's limit is not)
		h.SetCanonical(hRateLimitPolicy, f.policy)
		h.SetCanonical(hXLimit, f.xlimit)
	} else {
		buf = AppendPolicy(buf[:0], q)
		h.SetCanonical(hRateLimitPolicy, buf)
		buf = strconv.AppendUint(buf[:0], q.Limit, 10)
		h.SetCanonical(hXLimit, buf)
	}
	buf = AppendRateLimit(buf[:0], q, now)
	h.SetCanonical(hRateLimit, buf)
	buf = strconv.AppendUint(buf[:0], q.Remaining, 10)
	h.SetCanonical(hXRemaining, buf)
	buf = strconv.AppendInt(buf[:0], ceilSeconds(q.ResetAt), 10) // Unix seconds, as GitHub's
	h.SetCanonical(hXReset, buf)
	return buf
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

// writeRefusal writes a 429 with Retry-After, the quota headers and an RFC
// 9457 problem body naming the violated policy.
func writeRefusal(ctx *fasthttp.RequestCtx, q *Quota, now int64, jitter time.Duration, buf []byte) []byte {
	ra := RetryAfter(q.ReleaseAt, now, jitter)
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	h := &ctx.Response.Header
	buf = setQuotaHeaders(h, q, now, buf)
	buf = strconv.AppendInt(buf[:0], ra, 10)
	h.SetCanonical(hRetryAfter, buf)
	h.SetContentType(ctProblem)
	if f := q.fixed; f != nil && f.limit == q.Limit {
		buf = append(buf[:0], f.problem...)
		buf = strconv.AppendInt(buf, ra, 10)
		buf = append(buf, '}')
	} else {
		buf = AppendProblem(buf[:0], q, ra)
	}
	ctx.Response.SetBody(buf)
	return buf
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

// writeProblem writes a problem+json response for a request the edge will
// not decide (no key, bad cost); detail must need no JSON escaping.
func writeProblem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(ctProblem)
	ctx.Response.SetBodyString(`{"type":"about:blank","title":"` + title + `","status":` + strconv.Itoa(status) + `,"detail":"` + detail + `"}`)
}
