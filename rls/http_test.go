package rls_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/rls"
)

// HTTPHandler answers /json as envoyproxy/ratelimit's JSON handler (200,
// 429, 400, the response in protobuf's JSON form) and /healthcheck "OK",
// 500 once Stop began.
func TestRLSHTTPHandler(t *testing.T) {
	h := startRLS(t, inline("domain: j\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), rls.Config{}, edge.Options{})
	srv := httptest.NewServer(h.rls.HTTPHandler())
	defer srv.Close()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	const call = `{"domain": "j", "descriptors": [{"entries": [{"key": "k", "value": "a"}]}]}`
	for i, want := range []int{200, 429} {
		code, body := do("POST", "/json", call)
		if code != want {
			t.Fatalf("call %d: %d %s, want %d", i, code, body, want)
		}
		var r rlspb.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("call %d: %q: %v", i, body, err)
		}
		wantCode := []rlspb.RateLimitResponse_Code{ok, over}[i]
		checkResp(t, "json", &r, wantCode, st{code: wantCode, rpu: 1, unit: minute, reset: 50})
	}
	for _, bad := range []string{"", "{", `{"domain": "j"}`, `{"domain": "j", "descriptors": [{"entries": [{"key": "k"}]}], "extra": 1}`} {
		if code, body := do("POST", "/json", bad); code != 400 || body != "Bad Request\n" {
			t.Errorf("/json %q: %d %q, want 400 Bad Request", bad, code, body)
		}
	}
	if code, body := do("GET", "/healthcheck", ""); code != 200 || body != "OK" {
		t.Errorf("/healthcheck: %d %q, want 200 OK", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.rls.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _ := do("GET", "/healthcheck", ""); code != 500 {
		t.Errorf("/healthcheck after Stop: %d, want 500", code)
	}
}
