package httpedge

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/poplimit/poplimit/clientaddr"

	"github.com/poplimit/poplimit/rules"
)

// Role is how the edge sits in the request path: answering checks, or
// forwarding what it admits.
type Role string

const (
	// Decision answers each request itself: 200 to allow, 429 to refuse. It
	// is what Envoy's ext_authz HTTP filter calls, and it also serves the
	// JSON endpoint POST /decide.
	Decision Role = "decision"
	// Proxy forwards allowed requests to Upstream and adds the quota
	// headers to the upstream's response.
	Proxy Role = "proxy"
)

// DefaultCheckPrefix is Config.CheckPrefix's default, and the offline
// simulator's (loadtest.OfflineConfig), which simulates a decision-mode
// edge.
const DefaultCheckPrefix = "/check"

// Config configures an edge server. The zero value of each field means the
// default written beside it; Validate reports what is wrong.
type Config struct {
	Mode Role // default Decision

	// Upstream is the origin of Proxy mode: one host:port, or several
	// separated by commas (at most MaxUpstreams), each request going to
	// the next healthy one round-robin. Proxy mode streams request and
	// response bodies (MaxDecisionBody does not bound them there) and behaves
	// as RFC 9110 §7.6 has a proxy behave: see proxy.go.
	Upstream string
	// UpstreamTimeout bounds a proxied request's whole exchange with the
	// upstreams, retries and the streamed response body included: an
	// upstream that does not answer within it is answered 504, and a
	// response body still streaming then is cut off.
	UpstreamTimeout     time.Duration // default 10s
	UpstreamConns       int           // default 512 connections at most, per upstream
	UpstreamDialTimeout time.Duration // default 1s to connect to an upstream (a failure is retried on the next)
	// UpstreamHealthPath, when set (e.g. "/healthz"), turns on active
	// health checks: every UpstreamHealthInterval each upstream is asked
	// GET UpstreamHealthPath, which must answer 2xx or 3xx within
	// UpstreamHealthTimeout. After UpstreamHealthThreshold failures in a
	// row an upstream is skipped, until one check passes again. When every
	// upstream is failing, requests go to all of them round-robin. Default
	// off: every upstream is picked.
	UpstreamHealthPath      string
	UpstreamHealthInterval  time.Duration // default 2s
	UpstreamHealthTimeout   time.Duration // default 1s (at most the interval)
	UpstreamHealthThreshold int           // default 2 failed checks in a row
	// UpstreamRetries is how many times a request is sent again, each time
	// to the next upstream, after a connection error (the dial failed, or
	// the connection closed before any response; never after a response or
	// a timeout). Only idempotent requests are retried (GET, HEAD,
	// OPTIONS, PUT, DELETE, TRACE), and POST or PATCH carrying
	// UpstreamIdempotencyHeader, and only while their body can be sent
	// again (at most 64 KiB, or not read yet).
	UpstreamRetries int // default 1; -1: never
	// UpstreamIdempotencyHeader names the header that makes a POST or PATCH
	// retryable (draft-ietf-httpapi-idempotency-key-header); "-": none does.
	UpstreamIdempotencyHeader string // default "Idempotency-Key"

	// CheckPrefix is stripped from the path of a check in Decision mode,
	// matching the path_prefix of Envoy's ext_authz http_service.
	CheckPrefix string // default DefaultCheckPrefix

	// TrustedProxies are the networks whose X-Forwarded-For (and
	// ClientIPHeader) are believed. A request from anywhere else is keyed by
	// its TCP peer address.
	TrustedProxies []netip.Prefix
	// Forwarding is the header trusted proxies append their hops to:
	// XForwardedFor or Forwarded (RFC 7239). Only that one is read; every
	// line of it counts, walked from the right through trusted hops.
	Forwarding clientaddr.Forwarding // default clientaddr.XForwardedFor
	// ForwardedMethodHeader, when set (e.g. "X-Forwarded-Method"), is
	// believed from a trusted proxy in Decision mode as the request's
	// method: Caddy's forward_auth asks with GET whatever the request's
	// method and says the real one there. Default off.
	ForwardedMethodHeader string
	// ClientIPHeader, when set (e.g. "CF-Connecting-IP"), is believed from a
	// trusted proxy before the forwarding header (its last line, if it
	// holds an address).
	ClientIPHeader string

	// Server limits.
	ReadTimeout  time.Duration // default 10s
	WriteTimeout time.Duration // default 10s
	// IdleTimeout is how long a kept-alive connection may wait for its
	// next request before the edge closes it.
	IdleTimeout   time.Duration // default 60s
	MaxHeaderSize int           // default 8192 bytes: larger requests get 431
	// MaxDecisionBody bounds a request body in Decision mode, checks and
	// POST /_poplimit/decide alike: a larger one is answered 413 (RFC 9457
	// problem+json) as soon as its head is read, from Content-Length or a
	// chunk's size, before any of it is buffered. A check needs no body and
	// a decide request a few hundred bytes; the default admits every decide
	// request whose key is within its 4096 bytes, however escaped. Proxy
	// mode streams bodies and does not apply it.
	MaxDecisionBody int // default 32 KiB, at most 4 MiB
	// Concurrency bounds the connections served at once, each holding a
	// file descriptor; beyond it a new connection is answered 503.
	Concurrency int // default 65536
	// MaxConnsPerClient bounds the connections one client holds open at
	// once, counted by TCP peer address (an IPv6 client by its /64) when
	// the connection is accepted, before TLS or HTTP: a connection beyond
	// it is closed at once, answered 429 (problem+json) on a plain
	// listener. Connections from TrustedProxies are not counted: a proxy
	// carries many clients' requests. -1 turns the cap off.
	MaxConnsPerClient int // default 1024
	// MaxConns bounds the traffic connections open in all, below the
	// open-file limit, so that descriptors are left for new clients, the
	// admin listener and the stores however many clients each stay within
	// MaxConnsPerClient. From three quarters of it the edge is under
	// pressure: each connection it accepts closes the one idle longest (a
	// kept-alive connection waiting for its next request, or a new one
	// that has sent nothing), and a client's cap tightens to an eighth of
	// the room left (at least 8). At MaxConns, with none idle, a new
	// connection is answered 503 and closed. It is at most Concurrency;
	// -1 turns it off.
	MaxConns int // default: edge.Build derives it from the open-file limit (edge.Options.ConnsFor); a Server built otherwise: Concurrency

	// TLSCert and TLSKey, both set, serve the traffic listener over TLS
	// (1.2 and 1.3 only, AEAD suites); the pair is reloaded when either
	// file changes (polled every edge.Options.ReloadPoll, and on SIGHUP) without
	// dropping connections, and a pair that does not load keeps the old
	// one and is counted.
	TLSCert, TLSKey string

	// DecideToken turns on POST /_poplimit/decide in decision mode for
	// callers that send "Authorization: Bearer <DecideToken>" (at least 16
	// bytes). Without it the endpoint is off: any caller reaching it could
	// spend any key's quota. It is never served in proxy mode.
	DecideToken string
}

// MinTokenLen is the shortest bearer token accepted.
const MinTokenLen = 16

// DefaultMaxDecisionBody is Config.MaxDecisionBody's default: a decide
// request's key of maxJSONKey bytes escaped as \uXXXX (6 bytes each, as
// encoding/json writes <, > and &) with its rule, cost and some white
// space.
const DefaultMaxDecisionBody = 32 << 10

// maxDecisionBodyLimit is the largest MaxDecisionBody accepted.
const maxDecisionBodyLimit = 4 << 20

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = Decision
	}
	if c.Forwarding == "" {
		c.Forwarding = clientaddr.XForwardedFor
	}
	if c.UpstreamTimeout == 0 {
		c.UpstreamTimeout = 10 * time.Second
	}
	if c.UpstreamConns == 0 {
		c.UpstreamConns = 512
	}
	if c.UpstreamDialTimeout == 0 {
		c.UpstreamDialTimeout = time.Second
	}
	if c.UpstreamHealthInterval == 0 {
		c.UpstreamHealthInterval = 2 * time.Second
	}
	if c.UpstreamHealthTimeout == 0 {
		c.UpstreamHealthTimeout = time.Second
	}
	if c.UpstreamHealthThreshold == 0 {
		c.UpstreamHealthThreshold = 2
	}
	if c.UpstreamRetries == 0 {
		c.UpstreamRetries = 1
	}
	if c.UpstreamIdempotencyHeader == "" {
		c.UpstreamIdempotencyHeader = "Idempotency-Key"
	}
	if c.CheckPrefix == "" {
		c.CheckPrefix = DefaultCheckPrefix
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 10 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 60 * time.Second
	}
	if c.MaxHeaderSize == 0 {
		c.MaxHeaderSize = 8192
	}
	if c.MaxDecisionBody == 0 {
		c.MaxDecisionBody = DefaultMaxDecisionBody
	}
	if c.Concurrency == 0 {
		c.Concurrency = 65536
	}
	if c.MaxConnsPerClient == 0 {
		c.MaxConnsPerClient = 1024
	}
}

// Validate reports every invalid field with its name and value.
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, value any, reason string) {
		errs = append(errs, fmt.Errorf("httpedge: %s %v: %s", field, value, reason))
	}
	switch c.Mode {
	case "", Decision:
	case Proxy:
		if c.Upstream == "" {
			bad("Upstream", `""`, "is required in proxy mode")
		}
	default:
		bad("Mode", fmt.Sprintf("%q", c.Mode), `must be "decision" or "proxy"`)
	}
	if c.Upstream != "" {
		if _, err := ParseUpstreams(c.Upstream); err != nil {
			reason := strings.ReplaceAll(strings.ReplaceAll(err.Error(), "edge: ", ""), "\n", "; ")
			bad("Upstream", fmt.Sprintf("%q", c.Upstream), "must be host:port, or several separated by commas ("+reason+")")
		}
	}
	c.validateUpstream(bad)
	switch c.Forwarding {
	case "", clientaddr.XForwardedFor, clientaddr.Forwarded:
	default:
		bad("Forwarding", fmt.Sprintf("%q", c.Forwarding), `must be "x-forwarded-for" or "forwarded"`)
	}
	if c.CheckPrefix != "" && c.CheckPrefix[0] != '/' {
		bad("CheckPrefix", fmt.Sprintf("%q", c.CheckPrefix), `must start with "/"`)
	}
	for name, d := range map[string]time.Duration{"UpstreamTimeout": c.UpstreamTimeout, "ReadTimeout": c.ReadTimeout,
		"WriteTimeout": c.WriteTimeout, "IdleTimeout": c.IdleTimeout} {
		if d < 0 || d > time.Hour {
			bad(name, d, "must be between 0 (default) and 1h")
		}
	}
	if c.MaxHeaderSize < 0 || c.MaxHeaderSize > 1<<20 {
		bad("MaxHeaderSize", c.MaxHeaderSize, "must be between 0 (default) and 1 MiB")
	}
	if c.MaxDecisionBody < 0 || c.MaxDecisionBody > maxDecisionBodyLimit {
		bad("MaxDecisionBody", c.MaxDecisionBody, "must be between 0 (default) and 4 MiB")
	}
	if c.Concurrency < 0 {
		bad("Concurrency", c.Concurrency, "must not be negative")
	}
	if c.MaxConns < -1 {
		bad("MaxConns", c.MaxConns, "must be -1 (no cap), 0 (default) or positive")
	}
	if c.MaxConnsPerClient < -1 {
		bad("MaxConnsPerClient", c.MaxConnsPerClient, "must be -1 (no cap), 0 (default) or positive")
	}
	if c.ForwardedMethodHeader != "" && !rules.IsToken(c.ForwardedMethodHeader) {
		bad("ForwardedMethodHeader", fmt.Sprintf("%q", c.ForwardedMethodHeader), "is not a header name")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("TLSCert", fmt.Sprintf("%q and TLSKey %q", c.TLSCert, c.TLSKey), "must be set together")
	}
	if c.DecideToken != "" && (len(c.DecideToken) < MinTokenLen || strings.ContainsAny(c.DecideToken, " \t\r\n")) {
		bad("DecideToken", fmt.Sprintf("of %d bytes", len(c.DecideToken)), "must be at least 16 bytes with no white space")
	}
	if c.ClientIPHeader != "" && strings.ContainsAny(c.ClientIPHeader, " :\t\r\n") {
		bad("ClientIPHeader", fmt.Sprintf("%q", c.ClientIPHeader), "is not a header name")
	}
	return errors.Join(errs...)
}

// maxConns is the total connection cap in force: MaxConns, at most
// Concurrency (past which fasthttp answers 503 without making room); 0:
// none.
func (c *Config) maxConns() int {
	switch {
	case c.MaxConns < 0:
		return 0
	case c.MaxConns == 0 || c.Concurrency > 0 && c.MaxConns > c.Concurrency:
		return c.Concurrency
	}
	return c.MaxConns
}

// validateUpstream reports the proxy fields' errors through bad.
func (c Config) validateUpstream(bad func(field string, value any, reason string)) {
	if c.UpstreamConns < 0 {
		bad("UpstreamConns", c.UpstreamConns, "must not be negative")
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"UpstreamDialTimeout", c.UpstreamDialTimeout}, {"UpstreamHealthInterval", c.UpstreamHealthInterval},
		{"UpstreamHealthTimeout", c.UpstreamHealthTimeout}} {
		if f.d < 0 || f.d > time.Hour {
			bad(f.name, f.d, "must be between 0 (default) and 1h")
		}
	}
	if p := c.UpstreamHealthPath; p != "" && (p[0] != '/' || strings.ContainsAny(p, " \t\r\n#")) {
		bad("UpstreamHealthPath", fmt.Sprintf("%q", p), `must start with "/" and hold no white space or "#"`)
	}
	if c.UpstreamHealthThreshold < 0 || c.UpstreamHealthThreshold > 100 {
		bad("UpstreamHealthThreshold", c.UpstreamHealthThreshold, "must be between 0 (default) and 100")
	}
	if c.UpstreamRetries < -1 || c.UpstreamRetries > 10 {
		bad("UpstreamRetries", c.UpstreamRetries, "must be between -1 (never) and 10")
	}
	if h := c.UpstreamIdempotencyHeader; h != "" && h != "-" && !rules.IsToken(h) {
		bad("UpstreamIdempotencyHeader", fmt.Sprintf("%q", h), `is not a header name (or "-")`)
	}
}
