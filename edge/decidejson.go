package edge

import (
	"encoding/json"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// DecideRequest is the body of POST /_poplimit/decide: may Key do Cost more
// under Rule? The answer counts like any request.
type DecideRequest struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	Cost uint64 `json:"cost"` // default the rule's cost
}

// DecideResponse is the answer of POST /_poplimit/decide.
type DecideResponse struct {
	Allowed      bool   `json:"allowed"`
	Rule         string `json:"rule"`
	Limit        uint64 `json:"limit"`
	Remaining    uint64 `json:"remaining"`
	ResetMillis  int64  `json:"reset_ms"`       // until the current window ends
	RetryMillis  int64  `json:"retry_after_ms"` // refused only: until a request of this cost fits
	FromBlocks   bool   `json:"from_block_cache"`
	FallbackUsed bool   `json:"fallback"`
}

const maxJSONKey = 4096

func (s *Server) handleDecideJSON(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, "POST")
		writeProblem(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed", "use POST")
		return
	}
	var req DecideRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "the body is not a JSON decide request")
		return
	}
	if req.Key == "" || len(req.Key) > maxJSONKey {
		writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "key must be 1 to 4096 bytes")
		return
	}
	now := s.now()
	t := now.UnixNano()
	d := s.core.DecideKey(now, req.Rule, unsafeBytes(req.Key), req.Cost)
	defer s.core.Finish(d)
	switch d.Outcome {
	case Undecidable:
		status, title := fasthttp.StatusUnprocessableEntity, "Unprocessable Entity"
		if d.Quota.Rule == nil {
			status, title = fasthttp.StatusNotFound, "Not Found"
		}
		writeProblem(ctx, status, title, d.Reason)
		return
	case Denied:
		writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", d.Reason)
		return
	}
	q := &d.Quota
	resp := DecideResponse{Allowed: d.Outcome == Allowed, Rule: q.Rule.Name, Limit: q.Limit, Remaining: q.Remaining,
		ResetMillis: max(0, (q.ResetAt-t)/int64(time.Millisecond)), FromBlocks: d.FromBlockCache,
		FallbackUsed: d.Fallback}
	if d.Outcome == Limited {
		resp.RetryMillis = max(0, (q.ReleaseAt-t+int64(time.Millisecond)-1)/int64(time.Millisecond))
		setQuotaHeaders(&ctx.Response.Header, q, t, nil)
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	}
	body, _ := json.Marshal(resp)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// unsafeBytes views s as bytes that must not be modified.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
