package edge

import (
	"encoding/json"
	"time"

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
	sn := s.rules.Load()
	r := sn.rules.Lookup(req.Rule)
	switch {
	case r == nil:
		writeProblem(ctx, fasthttp.StatusNotFound, "Not Found", "no such rule")
		return
	case req.Key == "" || len(req.Key) > maxJSONKey:
		writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "key must be 1 to 4096 bytes")
		return
	case req.Cost > max(r.MaxCost, r.Cost):
		writeProblem(ctx, fasthttp.StatusBadRequest, "Bad Request", "cost is above the rule's bound")
		return
	}
	if req.Cost == 0 {
		req.Cost = r.Cost
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	sc.key = append(sc.key[:0], req.Key...)
	now := s.now()
	t := now.UnixNano()
	q, refused := s.decide(sn, r, sc, now, t, req.Cost)
	resp := DecideResponse{Allowed: !refused, Rule: r.Name, Limit: q.limit, Remaining: q.remaining,
		ResetMillis: max(0, (q.resetAt-t)/int64(time.Millisecond)), FromBlocks: sc.ev.FromBlockCache,
		FallbackUsed: sc.ev.Fallback}
	if refused {
		resp.RetryMillis = max(0, (q.releaseAt-t+int64(time.Millisecond)-1)/int64(time.Millisecond))
		sc.buf = setQuotaHeaders(&ctx.Response.Header, &q, t, sc.buf)
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	}
	body, _ := json.Marshal(resp)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
