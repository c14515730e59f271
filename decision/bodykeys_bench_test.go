package decision

import (
	"context"
	"testing"

	"github.com/poplimit/poplimit/rules"
	"github.com/poplimit/poplimit/store"
	"github.com/poplimit/poplimit/window"
)

// BenchmarkDecideBodyKey measures a decision keyed by a header against
// the same keyed by a form field or a JSON member of a login body (the
// body already held by the front end), with and without key_case:
// insensitive: the cost a body key adds to the core.
func BenchmarkDecideBodyKey(b *testing.B) {
	const body = `{"user": {"email": "Alice@Example.com", "name": "Alice"}, "password": "correct horse battery staple", "remember": true}`
	form := "username=Alice%40Example.com&password=correct+horse+battery+staple&remember=on&csrf=8f14e45fceea167a5a36dedd4bea2543"
	for _, bc := range []struct {
		name, rule string
		f          Fields
	}{
		{"header", `key: ["header:X-User"]`, &bodyFields{header: map[string][]string{"X-User": {"Alice@Example.com"}}}},
		{"form", `key: ["form:username"]`, formBody(form)},
		{"form-insensitive", `key: ["form:username"], key_case: insensitive`, formBody(form)},
		{"json", `key: ["json:/user/email"]`, jsonBody(body)},
		{"json-insensitive", `key: ["json:/user/email"], key_case: insensitive`, jsonBody(body)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			clk := newSteppedClock()
			rs, err := rules.ParseRules([]byte("rules:\n  - {name: r, limit: 1000000000, window: 1h, " + bc.rule + "}\n"))
			if err != nil {
				b.Fatal(err)
			}
			lim, err := window.New(window.Config{Clock: clk}, store.NewMemStore(clk))
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close(context.Background())
			c, err := NewCore(CoreConfig{}, rs, CoreDeps{Limiter: lim})
			if err != nil {
				b.Fatal(err)
			}
			req := &Request{Method: []byte("POST"), Path: []byte("/login"), Addr: clientIP, Fields: bc.f, Now: clk.Now()}
			c.Finish(c.Decide(req)) // warm
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				c.Finish(c.Decide(req))
			}
		})
	}
}
