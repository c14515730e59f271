package rls

import (
	"io"
	"net/http"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds the body of a POST /json: a RateLimitRequest of
// MaxDescriptors descriptors fits many times over.
const maxJSONBody = 1 << 20

// HTTPHandler serves envoyproxy/ratelimit's HTTP port: /json, a
// RateLimitRequest in protobuf's JSON form (any method, as ratelimit
// takes any), answered with the RateLimitResponse in the same form, status
// 200 for OK, 429 for OVER_LIMIT, 400 for a body that does not parse or a
// request the service refuses, 500 for a response of code UNKNOWN; and
// /healthcheck, "OK" while the service is healthy (the edge is ready, the
// rules in force came from envoyproxy/ratelimit files, Stop not called),
// 500 otherwise. Each answer is counted in
// poplimit_rls_http_requests_total{path, code}.
func (s *Service) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", s.serveJSON)
	mux.HandleFunc("/healthcheck", s.serveHealth)
	return mux
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		s.m.httpAnswer("json", http.StatusBadRequest)
		s.log.Warn("rls: /json: reading the body", "err", err)
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	var req rlspb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		s.m.httpAnswer("json", http.StatusBadRequest)
		s.log.Warn("rls: /json: not a RateLimitRequest", "err", err)
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		s.m.httpAnswer("json", http.StatusBadRequest)
		s.log.Warn("rls: /json: refused", "err", err)
		http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	code := http.StatusOK
	switch resp.OverallCode {
	case rlspb.RateLimitResponse_UNKNOWN:
		code = http.StatusInternalServerError
	case rlspb.RateLimitResponse_OVER_LIMIT:
		code = http.StatusTooManyRequests
	}
	s.release(resp)
	if err != nil {
		s.m.httpAnswer("json", http.StatusInternalServerError)
		s.log.Error("rls: /json: marshaling the response", "err", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	s.m.httpAnswer("json", code)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(out)
}

func (s *Service) serveHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped || !s.ready() {
		s.m.httpAnswer("healthcheck", http.StatusInternalServerError)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	s.m.httpAnswer("healthcheck", http.StatusOK)
	w.Write([]byte("OK"))
}
