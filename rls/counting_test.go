package rls_test

import (
	"strings"
	"testing"
	"time"

	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/poplimit/poplimit/edge"
	"github.com/poplimit/poplimit/rls"
)

const countingDescriptors = `
domain: login
descriptors:
  - key: account
    rate_limit:
      requests_per_unit: 5
      window: 15m
      algorithm: sliding_window
      action: throttle
      count: {status: [401, 403]}
`

// streamDoneRoute is the route configuration documented in
// rules/envoyconf/SERVICE.md: the request path asks with the account, the
// stream's end settles with the response's status.
const streamDoneRoute = `
rate_limits:
  - actions:
      - request_headers: {header_name: x-user, descriptor_key: account}
  - apply_on_stream_done: true
    actions:
      - request_headers: {header_name: poplimit-reservation, descriptor_key: poplimit_reservation}
    hits_addend: {format: "%RESPONSE_CODE%"}
`

// The documented route configuration is one Envoy's API accepts: it
// parses into RateLimitPerRoute and passes the API's validation.
func TestStreamDoneRouteConfigIsValid(t *testing.T) {
	js, err := yaml.YAMLToJSON([]byte(streamDoneRoute))
	if err != nil {
		t.Fatal(err)
	}
	var per ratelimitfilter.RateLimitPerRoute
	if err := protojson.Unmarshal(js, &per); err != nil {
		t.Fatalf("RateLimitPerRoute: %v", err)
	}
	if err := per.ValidateAll(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	done := per.GetRateLimits()[1]
	if !done.GetApplyOnStreamDone() || done.GetHitsAddend().GetFormat() != "%RESPONSE_CODE%" ||
		done.GetActions()[0].GetRequestHeaders().GetDescriptorKey() != rls.ReservationKey ||
		done.GetActions()[0].GetRequestHeaders().GetHeaderName() != rls.ReservationHeader {
		t.Errorf("stream-done rate limit: %v", done)
	}
	var _ *routepb.RateLimit = done
}

// Through Envoy's rate limit service, a counting descriptor reserves its
// hit on the request path and answers with the reservation in
// request_headers_to_add; the stream-done call, carrying that header and
// the response's status as hits_addend, settles it: failures count,
// successes do not, a response that never came (status 0) keeps it, an
// unknown reservation changes nothing.
func TestRLSCountsAtStreamDone(t *testing.T) {
	h := startRLS(t, inline(countingDescriptors), rls.Config{}, edge.Options{Clock: newClock(time.Now())})
	request := func() (rlspb.RateLimitResponse_Code, string) {
		resp := h.ask(t, "login", 0, desc("account", "alice"))
		id := ""
		for _, hv := range resp.GetRequestHeadersToAdd() {
			if hv.GetKey() == rls.ReservationHeader {
				id = hv.GetValue()
			}
		}
		return resp.GetOverallCode(), id
	}
	done := func(id string, status uint64) {
		resp := h.ask(t, "login", 0, withHits(desc(rls.ReservationKey, id), status))
		if resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
			t.Fatalf("stream-done call: %v", resp.GetOverallCode())
		}
	}
	for i := range 50 {
		code, id := request()
		if code != rlspb.RateLimitResponse_OK || len(id) != 32 {
			t.Fatalf("login %d: %v, reservation %q", i, code, id)
		}
		done(id, 200)
	}
	done(strings.Repeat("f", 32), 401) // names nothing
	var ids []string
	for i := range 5 {
		code, id := request()
		if code != rlspb.RateLimitResponse_OK || id == "" {
			t.Fatalf("attempt %d: %v %q", i, code, id)
		}
		ids = append(ids, id)
	}
	if code, id := request(); code != rlspb.RateLimitResponse_OVER_LIMIT || id != "" {
		t.Errorf("sixth with five reserved: %v %q, want OVER_LIMIT and no reservation", code, id)
	}
	for _, id := range ids[:3] {
		done(id, 401)
	}
	done(ids[3], 0) // the client went away: kept
	done(ids[4], 200)
	code, id := request()
	if code != rlspb.RateLimitResponse_OK {
		t.Fatalf("after a success gave its hit back: %v", code)
	}
	done(id, 403)
	if code, _ := request(); code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after 5 counted: %v, want OVER_LIMIT", code)
	}
}
