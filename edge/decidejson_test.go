package edge_test

import (
	"testing"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/edge/edgetest"
	"github.com/poplimit/poplimit/internal/testenv"
	"github.com/valyala/fasthttp"
)

// FuzzDecideBody: whatever the body, the JSON endpoint answers with one of
// its statuses and a body, and never panics.
func FuzzDecideBody(f *testing.F) {
	for _, s := range []string{`{"rule":"api","key":"k","cost":2}`, `{"rule":"api","key":""}`, `{"rule":"nope","key":"k"}`,
		`{"rule":"uploads","key":"k"}`, `{"rule":"api","key":"k","cost":-1}`, `{"rule":"api","key":"k","cost":1e99}`, `[`, `null`, ``} {
		f.Add([]byte(s))
	}
	var o edge.Options
	o.Server.DecideToken = "fuzz-token-of-16-bytes"
	e := edgetest.New(f, `
rules:
  - {name: api, limit: 3, window: 1m}
  - {name: uploads, kind: concurrency, limit: 1}
`, o)
	h := e.Server.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		var ctx fasthttp.RequestCtx
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://x/_poplimit/decide")
		req.Header.Set("Authorization", "Bearer fuzz-token-of-16-bytes")
		req.SetBody(body)
		ctx.Init(&req, nil, nil)
		h(&ctx)
		switch s := ctx.Response.StatusCode(); s {
		case 200, 400, 404, 422, 429:
		default:
			t.Fatalf("body %q: status %d", body, s)
		}
		if len(ctx.Response.Body()) == 0 {
			t.Fatalf("body %q: an empty answer", body)
		}
		if n := testenv.MetricSum(t, e.Registry, "poplimit_edge_panics_total"); n != 0 {
			t.Fatalf("body %q: %v panics", body, n)
		}
	})
}
