package httpedge

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
)

// writeRefusal writes a 429 with Retry-After, the quota fields and an RFC
// 9457 problem body naming the violated policy, using buf as scratch; it
// returns buf for reuse.
func writeRefusal(ctx *fasthttp.RequestCtx, q *decision.Quota, now int64, jitter time.Duration, buf []byte) []byte {
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	buf = q.SetRefusal(&ctx.Response.Header, now, decision.RetryAfter(q.ReleaseAt, now, jitter), buf)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBody(buf)
	return buf
}

// writeProblem writes a problem+json response for a request the edge will
// not decide (no key, bad cost); detail must need no JSON escaping.
func writeProblem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBodyString(`{"type":"about:blank","title":"` + title + `","status":` + strconv.Itoa(status) + `,"detail":"` + detail + `"}`)
}
