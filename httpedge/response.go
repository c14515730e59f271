package httpedge

import (
	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
)

// writeRefusal answers a verdict that is not Allowed as the core renders
// it for every front end (decision.Verdict.Refuse): its status, fields and
// RFC 9457 problem body.
func writeRefusal(ctx *fasthttp.RequestCtx, v *decision.Verdict) {
	status, body := v.Refuse(&ctx.Response.Header)
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBody(body)
}

// writeProblem answers a request the edge refuses before any decision (a
// bad path, framing or method, no token) with the core's problem body
// (decision.AppendProblem). It does not allocate for a detail of a few
// hundred bytes.
func writeProblem(ctx *fasthttp.RequestCtx, status int, detail string) {
	var room [512]byte
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentType(decision.ContentTypeProblem)
	ctx.Response.SetBody(decision.AppendProblem(room[:0], status, detail))
}
