package rls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The values of Config.Headers.
const (
	HeadersDraft     = "draft"     // RateLimit-Policy, RateLimit, Retry-After (draft-ietf-httpapi-ratelimit-headers)
	HeadersRatelimit = "ratelimit" // envoyproxy/ratelimit's RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset
	HeadersNone      = "none"
)

// Config configures a Service. The zero value of each field means the
// default written beside it; validate reports every bad field.
type Config struct {
	// Headers says what response_headers_to_add carries, for the
	// descriptor envoyproxy/ratelimit would choose (the last one over its
	// limit, else the one with the least remaining):
	//   - "draft" (default): RateLimit-Policy ("name";q=100;w=60) and
	//     RateLimit ("name";r=5;t=30) of draft-ietf-httpapi-ratelimit-headers
	//     (-09 to -11 agree on these parameters), and Retry-After (seconds,
	//     never before the release nor the RateLimit t) when the answer is
	//     OVER_LIMIT;
	//   - "ratelimit": RateLimit-Limit, RateLimit-Remaining and
	//     RateLimit-Reset, as ratelimit writes them with
	//     LIMIT_RESPONSE_HEADERS_ENABLED;
	//   - "none": nothing, ratelimit's default.
	Headers string
	// ShadowMode answers OK whatever the descriptors say (ratelimit's
	// SHADOW_MODE); the statuses keep their codes. Default false.
	ShadowMode bool
	// QuotaMode puts every descriptor in quota mode (ratelimit's
	// QUOTA_MODE): the answer is OVER_LIMIT only when all of them are.
	// Default false.
	QuotaMode bool
	// MaxDescriptors bounds the descriptors of one request, and so the
	// working memory pooled per request; a request with more is refused
	// with an error (ratelimit has no bound). Default 256, at most 65536.
	MaxDescriptors int
	// Reflection registers the gRPC server reflection service (grpcurl
	// and the like). Default false.
	Reflection bool
	// Ready reports whether the edge should receive traffic (edge.Edge.Ready);
	// the standard health service (grpc.health.v1) says SERVING while it
	// does and the rules in force came from envoyproxy/ratelimit files.
	// Default: always ready.
	Ready func() bool
	// HealthInterval is how often Ready is asked. Default 1s, at most 1m.
	HealthInterval time.Duration
	// The service reads the time and the Retry-After jitter from its core
	// (decision.Core.Now, RetryJitter), as every front end does.

	// LimitHeader, RemainingHeader and ResetHeader name the headers of
	// Headers "ratelimit" (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER). Default
	// RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
	LimitHeader, RemainingHeader, ResetHeader string
	// TLS, when set, serves gRPC over TLS with it (client certificates
	// required when it says so). Default: plaintext.
	TLS *tls.Config
	// TLSCert and TLSKey, set together, are the PEM files of the
	// service's certificate and key: gRPC over TLS 1.2 and 1.3 (1.2 with
	// ECDHE and AEAD ciphers only, unless TLS names its suites), the rest
	// of the configuration (client certificates) taken from TLS when set,
	// its certificates ignored. The pair is reloaded when its files change
	// (Service.TLSPair, watched by the edge), as envoyproxy/ratelimit
	// reloads GRPC_SERVER_TLS_CERT and _KEY: new handshakes get the new
	// pair, connections made keep theirs, and a pair that does not load
	// keeps the running one (poplimit_rls_tls_reloads_total). Default
	// none.
	TLSCert, TLSKey string
	// MaxConnectionAge and MaxConnectionAgeGrace close a client's
	// connection (GOAWAY) once it is this old, and force it closed the
	// grace later, so that clients spread over new servers
	// (envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE, _GRACE). Default 0:
	// connections live as long as their clients keep them.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
}

func (c *Config) setDefaults() {
	if c.Headers == "" {
		c.Headers = HeadersDraft
	}
	if c.MaxDescriptors == 0 {
		c.MaxDescriptors = 256
	}
	if c.Ready == nil {
		c.Ready = func() bool { return true }
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = time.Second
	}
	if c.LimitHeader == "" {
		c.LimitHeader = hdrRLLimit
	}
	if c.RemainingHeader == "" {
		c.RemainingHeader = hdrRLRemain
	}
	if c.ResetHeader == "" {
		c.ResetHeader = hdrRLReset
	}
}

func (c Config) validate() error {
	var errs []error
	switch c.Headers {
	case "", HeadersDraft, HeadersRatelimit, HeadersNone:
	default:
		errs = append(errs, fmt.Errorf("rls: Config.Headers %q: must be draft, ratelimit or none", c.Headers))
	}
	if c.MaxDescriptors < 0 || c.MaxDescriptors > 1<<16 {
		errs = append(errs, fmt.Errorf("rls: Config.MaxDescriptors %d: must be between 0 (default 256) and 65536", c.MaxDescriptors))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, fmt.Errorf("rls: Config.TLSCert %q, TLSKey %q: set both or neither", c.TLSCert, c.TLSKey))
	}
	if c.HealthInterval < 0 || c.HealthInterval > time.Minute {
		errs = append(errs, fmt.Errorf("rls: Config.HealthInterval %v: must be between 0 (default 1s) and 1m", c.HealthInterval))
	}
	for _, h := range []struct{ field, v string }{{"LimitHeader", c.LimitHeader}, {"RemainingHeader", c.RemainingHeader}, {"ResetHeader", c.ResetHeader}} {
		if h.v != "" && !validHeaderName(h.v) {
			errs = append(errs, fmt.Errorf("rls: Config.%s %q: not an HTTP header name (RFC 9110 token)", h.field, h.v))
		}
	}
	if c.MaxConnectionAge < 0 || c.MaxConnectionAgeGrace < 0 {
		errs = append(errs, fmt.Errorf("rls: Config.MaxConnectionAge %v, MaxConnectionAgeGrace %v: must not be negative", c.MaxConnectionAge, c.MaxConnectionAgeGrace))
	}
	return errors.Join(errs...)
}

// validHeaderName says whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
