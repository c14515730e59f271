package edge

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/poplimit/poplimit/window"
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

// quota is what the headers of one response say: the decision of the rule
// that constrains the client most.
type quota struct {
	rule      *window.Rule
	limit     uint64
	remaining uint64
	resetAt   int64 // Unix ns
	releaseAt int64 // Unix ns, refused only
}

// ceilSeconds returns d rounded up to whole seconds, at least 0.
func ceilSeconds(d int64) int64 {
	if d <= 0 {
		return 0
	}
	return (d + int64(time.Second) - 1) / int64(time.Second)
}

// setQuotaHeaders writes the quota headers of q to the response, using buf
// as scratch; it returns buf for reuse. It does not allocate once the
// response's header buffers have grown.
func setQuotaHeaders(h *fasthttp.ResponseHeader, q *quota, now int64, buf []byte) []byte {
	reset := ceilSeconds(q.resetAt - now)
	buf = append(buf[:0], '"')
	buf = append(buf, q.rule.NameBytes()...)
	buf = append(buf, `";q=`...)
	buf = strconv.AppendUint(buf, q.limit, 10)
	buf = append(buf, ";w="...)
	buf = strconv.AppendInt(buf, ceilSeconds(int64(q.rule.Window)), 10)
	h.SetCanonical(hRateLimitPolicy, buf)

	buf = append(buf[:0], '"')
	buf = append(buf, q.rule.NameBytes()...)
	buf = append(buf, `";r=`...)
	buf = strconv.AppendUint(buf, q.remaining, 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, reset, 10)
	h.SetCanonical(hRateLimit, buf)

	buf = strconv.AppendUint(buf[:0], q.limit, 10)
	h.SetCanonical(hXLimit, buf)
	buf = strconv.AppendUint(buf[:0], q.remaining, 10)
	h.SetCanonical(hXRemaining, buf)
	buf = strconv.AppendInt(buf[:0], ceilSeconds(q.resetAt), 10) // Unix seconds, as GitHub's
	h.SetCanonical(hXReset, buf)
	return buf
}

// retryAfter returns the Retry-After seconds for a refusal released at
// releaseAt: never before the release, plus up to jitter so refused clients
// spread their retries.
func retryAfter(releaseAt, now int64, jitter time.Duration) int64 {
	s := ceilSeconds(releaseAt - now)
	if j := int64(jitter / time.Second); j > 0 {
		s += rand.Int64N(j + 1)
	}
	return max(s, 1)
}

// writeRefusal writes a 429 with Retry-After, the quota headers and an RFC
// 9457 problem body naming the violated policy.
func writeRefusal(ctx *fasthttp.RequestCtx, q *quota, now int64, jitter time.Duration, buf []byte) []byte {
	ra := retryAfter(q.releaseAt, now, jitter)
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	h := &ctx.Response.Header
	buf = setQuotaHeaders(h, q, now, buf)
	buf = strconv.AppendInt(buf[:0], ra, 10)
	h.SetCanonical(hRetryAfter, buf)
	h.SetContentType(ctProblem)
	buf = append(buf[:0], `{"type":"https://poplimit.dev/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"rate limit `...)
	buf = append(buf, q.rule.NameBytes()...)
	buf = append(buf, ` exceeded: at most `...)
	buf = strconv.AppendUint(buf, q.limit, 10)
	buf = append(buf, ` per `...)
	buf = strconv.AppendInt(buf, ceilSeconds(int64(q.rule.Window)), 10)
	buf = append(buf, ` s","policy":"`...)
	buf = append(buf, q.rule.NameBytes()...) // rule names are [A-Za-z0-9-_.:/]: no escaping needed
	buf = append(buf, `","limit":`...)
	buf = strconv.AppendUint(buf, q.limit, 10)
	buf = append(buf, `,"retry_after":`...)
	buf = strconv.AppendInt(buf, ra, 10)
	buf = append(buf, '}')
	ctx.Response.SetBody(buf)
	return buf
}

// writeProblem writes a problem+json response for a request the edge will
// not decide (no key, bad cost); detail must need no JSON escaping.
func writeProblem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(ctProblem)
	ctx.Response.SetBodyString(`{"type":"about:blank","title":"` + title + `","status":` + strconv.Itoa(status) + `,"detail":"` + detail + `"}`)
}
