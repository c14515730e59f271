package httpedge

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
)

// writeRefusal writes v's refusal: 429 with Retry-After (up to jitter
// late), the quota fields and an RFC 9457 problem body naming the policy.
func writeRefusal(ctx *fasthttp.RequestCtx, v *decision.Verdict, jitter time.Duration) {
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	body := v.SetRefusal(&ctx.Response.Header, jitter)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBody(body)
}

// writeProblem writes a problem+json response for a request the edge will
// not decide (no key, bad cost); detail must need no JSON escaping.
func writeProblem(ctx *fasthttp.RequestCtx, status int, title, detail string) {
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBodyString(`{"type":"about:blank","title":"` + title + `","status":` + strconv.Itoa(status) + `,"detail":"` + detail + `"}`)
}
