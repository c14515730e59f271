// Package middleware puts poplimit's decision core in front of a Go
// program's own net/http handlers: func(http.Handler) http.Handler, over
// the same core as the edge server, with the same rules file, stores
// (in memory, memcached, Redis), decision events, response headers and
// refusal body. It imports no store client, transport or other front end;
// package middleware/fasthttpmw is the same for fasthttp.
//
// Build the core with decision.New over a store, then wrap handlers:
//
//	rs, err := rules.ParseRules(rulesYAML)
//	...
//	core, err := decision.New(rs, store.NewMemStore(nil), decision.Options{})
//	...
//	defer core.Close(ctx)
//	mw, err := middleware.New(core, middleware.Config{})
//	...
//	http.ListenAndServe(addr, mw(mux))
//
// A program that runs a whole edge (package edge) wraps handlers with its
// core the same way: edge.Edge.NetHTTP does.
//
// A request admitted under a counting rule (count: in the rules file) is
// settled from the handler's response: its status when the handler calls
// WriteHeader, or 200 at its first Write, Flush or ReadFrom, or when it
// returns having written nothing; the origin's cost header is read from
// the response's header as it is then. A handler that panics or hijacks
// the connection sends no response the middleware sees: the request keeps
// its units. The ResponseWriter is wrapped with github.com/felixge/httpsnoop
// so that the handler still finds every optional interface the server's
// writer has (http.Flusher, http.Hijacker, io.ReaderFrom, http.Pusher);
// the wrapping costs a few allocations, on those requests only.
//
// A refused request is answered by the middleware (429 with Retry-After,
// the RateLimit-Policy, RateLimit and X-RateLimit-* fields and an RFC 9457
// problem body; 400 for a missing key or a bad cost), an admitted one by
// the wrapped handler with the quota fields already set on its response.
// Concurrency rules hold their slot while the handler runs. The client is
// the connection's peer, or what a trusted proxy says
// (Config.TrustedProxies).
package middleware

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"unsafe"

	"github.com/felixge/httpsnoop"

	"github.com/poplimit/poplimit/clientaddr"
	"github.com/poplimit/poplimit/decision"
)

// Config is how the middleware finds the client and answers refusals. The
// zero value trusts no proxy: every request is keyed by its connection's
// peer.
type Config struct {
	// TrustedProxies are the networks whose forwarding header (and
	// ClientIPHeader) are believed; a request from anywhere else is keyed
	// by its peer address (http.Request.RemoteAddr).
	TrustedProxies []netip.Prefix
	// Forwarding is the header trusted proxies append their hops to:
	// clientaddr.XForwardedFor or clientaddr.Forwarded (RFC 7239).
	Forwarding clientaddr.Forwarding // default clientaddr.XForwardedFor
	// ClientIPHeader, when set (e.g. "CF-Connecting-IP"), is believed from
	// a trusted proxy before the forwarding header.
	ClientIPHeader string
}

// Validate reports every problem with c, each naming the field, or nil.
func (c Config) Validate() error {
	var errs []error
	switch c.Forwarding {
	case "", clientaddr.XForwardedFor, clientaddr.Forwarded:
	default:
		errs = append(errs, fmt.Errorf("middleware: Config.Forwarding %q: must be %q or %q", c.Forwarding, clientaddr.XForwardedFor, clientaddr.Forwarded))
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("middleware: Config.TrustedProxies: %v is not a valid prefix", p))
		}
	}
	return errors.Join(errs...)
}

// New returns net/http middleware deciding every request by core's rules
// before the wrapped handler sees it. It reports a nil core or an invalid
// cfg.
func New(core *decision.Core, cfg Config) (func(http.Handler) http.Handler, error) {
	if core == nil {
		return nil, errors.New("middleware: New: core is nil (decision.New builds one)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &netHTTP{core: core, addr: clientaddr.New(cfg.TrustedProxies, cfg.Forwarding, cfg.ClientIPHeader)}
	m.pool.New = func() any { return new(scratch) }
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type netHTTP struct {
	core  *decision.Core
	addr  *clientaddr.Resolver
	pool  sync.Pool // *scratch
	canon sync.Map  // header name → its canonical form
}

type scratch struct {
	hops clientaddr.Hops
	f    fields
}

func (m *netHTTP) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	sc := m.pool.Get().(*scratch)
	defer m.pool.Put(sc)
	peer, _ := netip.ParseAddrPort(r.RemoteAddr)
	sc.f = fields{m: m, r: r}
	defer func() { sc.f = fields{} }()
	req := decision.Request{Host: decision.HostOnly(bytesOf(r.Host)), Method: bytesOf(r.Method), Path: bytesOf(r.URL.Path),
		Addr: m.addr.FromHeader(peer.Addr(), r.Header, &sc.hops), Fields: &sc.f, Now: m.core.Now(), Tracked: true}
	if m.core.WantsBody(req.Host, req.Method, req.Path) {
		sc.f.body, sc.f.whole = holdBody(r, m.core.BodyKeyBytes()) // bodykeys.go
	}
	v := m.core.Decide(&req)
	defer m.core.Finish(v)
	h := netFields{h: w.Header()}
	if v.Outcome == decision.Allowed {
		v.SetFields(&h)
		if !v.Counting() {
			next.ServeHTTP(w, r)
			return
		}
		st := &settling{m: m, v: v, w: w}
		next.ServeHTTP(httpsnoop.Wrap(w, st.hooks()), r)
		st.settle(http.StatusOK) // the handler wrote nothing: 200 is implied
		return
	}
	status, body := v.Refuse(&h) // as every front end renders it
	h.h["Content-Type"] = []string{decision.ContentTypeProblem}
	w.WriteHeader(status)
	w.Write(body)
}

// netFields sets a response's quota fields on a net/http Header, under
// net/http's canonical names. net/http keeps each value as a string in a
// slice of its own: the slices share one array (capped, so an append by
// the handler copies), the strings are one each.
type netFields struct {
	h http.Header
	v []string
}

func (n *netFields) SetCanonical(name, value []byte) {
	if n.v == nil {
		n.v = make([]string, 0, 6)
	}
	n.v = append(n.v, string(value))
	i := len(n.v)
	n.h[netName(name)] = n.v[i-1 : i : i]
}

// netName is the net/http canonical form of a quota field's name.
func netName(name []byte) string {
	switch string(name) {
	case "RateLimit-Policy":
		return "Ratelimit-Policy"
	case "RateLimit":
		return "Ratelimit"
	case "X-RateLimit-Limit":
		return "X-Ratelimit-Limit"
	case "X-RateLimit-Remaining":
		return "X-Ratelimit-Remaining"
	case "X-RateLimit-Reset":
		return "X-Ratelimit-Reset"
	}
	return http.CanonicalHeaderKey(string(name))
}

// fields reads a net/http request's header fields, query parameters and
// cookies for the core as decision.Fields says, counting every occurrence, as
// the edge server does, without allocating for names already seen and
// values without escapes.
type fields struct {
	m *netHTTP
	r *http.Request
	// body is the body's prefix held for rules keyed by it, whole when
	// it is the whole body (bodykeys.go).
	body  []byte
	whole bool
}

// Header counts the lines of the header section called name.
func (f *fields) Header(name string) (first, last []byte, n int) {
	vs := f.r.Header[f.m.canonical(name)]
	if len(vs) == 0 {
		return nil, nil, 0
	}
	return bytesOf(vs[0]), bytesOf(vs[len(vs)-1]), len(vs)
}

// Query counts the pairs of the raw query whose percent-decoded name is
// name; a value with escapes is unescaped (which allocates), others are
// returned as they are.
func (f *fields) Query(name string) (first, last []byte, n int) {
	var fv, lv string
	for q := f.r.URL.RawQuery; q != ""; {
		var kv string
		kv, q, _ = strings.Cut(q, "&")
		k, v, _ := strings.Cut(kv, "=")
		if kv == "" || !decision.QueryNameIs(k, name) {
			continue
		}
		if n == 0 {
			fv = v
		}
		lv, n = v, n+1
	}
	if n == 0 {
		return nil, nil, 0
	}
	first = queryValue(fv)
	if n == 1 {
		return first, first, 1
	}
	return first, queryValue(lv), n
}

// RawQuery returns the query as the client sent it (decision.RawQuery).
func (f *fields) RawQuery() []byte { return bytesOf(f.r.URL.RawQuery) }

func queryValue(v string) []byte {
	if strings.ContainsAny(v, "%+") {
		if u, err := unescape(v); err == nil {
			return []byte(u)
		}
	}
	return bytesOf(v)
}

// Cookie counts the cookies called name in every Cookie line: values
// without surrounding blanks and one pair of surrounding double quotes,
// pairs whose value then holds '"', ';' or '\' skipped, as fasthttp does.
func (f *fields) Cookie(name string) (first, last []byte, n int) {
	for _, line := range f.r.Header["Cookie"] {
		for line != "" {
			var c string
			c, line, _ = strings.Cut(line, ";")
			k, v, ok := strings.Cut(c, "=")
			if !ok || strings.Trim(k, " \t") != name {
				continue
			}
			v = strings.Trim(v, " \t")
			if len(v) > 1 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			if strings.ContainsAny(v, `"\`) {
				continue
			}
			if n == 0 {
				first = bytesOf(v)
			}
			last, n = bytesOf(v), n+1
		}
	}
	return first, last, n
}

func (m *netHTTP) canonical(name string) string {
	if c, ok := m.canon.Load(name); ok {
		return c.(string)
	}
	c := textproto.CanonicalMIMEHeaderKey(name)
	m.canon.Store(name, c)
	return c
}

// bytesOf views s as bytes the core only reads during the call.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func unescape(v string) (string, error) { return url.QueryUnescape(v) }

// settling settles a counting request from the wrapped handler's
// response, once.
type settling struct {
	m       *netHTTP
	v       *decision.Verdict
	w       http.ResponseWriter
	settled bool
}

func (s *settling) settle(status int) {
	if s.settled {
		return
	}
	s.settled = true
	s.m.core.Settle(s.v, status, s)
}

// ResponseHeader reads the handler's response header for the rule's cost
// header (decision.ResponseHeader).
func (s *settling) ResponseHeader(name string) ([]byte, bool) {
	vs := s.w.Header()[s.m.canonical(name)]
	if len(vs) == 0 {
		return nil, false
	}
	return bytesOf(vs[0]), true
}

func (s *settling) hooks() httpsnoop.Hooks {
	return httpsnoop.Hooks{
		WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
			return func(code int) {
				if code >= 200 { // 1xx are interim; the final status comes after
					s.settle(code)
				}
				next(code)
			}
		},
		Write: func(next httpsnoop.WriteFunc) httpsnoop.WriteFunc {
			return func(b []byte) (int, error) {
				s.settle(http.StatusOK)
				return next(b)
			}
		},
		ReadFrom: func(next httpsnoop.ReadFromFunc) httpsnoop.ReadFromFunc {
			return func(src io.Reader) (int64, error) {
				s.settle(http.StatusOK)
				return next(src)
			}
		},
		Flush: func(next httpsnoop.FlushFunc) httpsnoop.FlushFunc {
			return func() {
				s.settle(http.StatusOK)
				next()
			}
		},
		Hijack: func(next httpsnoop.HijackFunc) httpsnoop.HijackFunc {
			return func() (net.Conn, *bufio.ReadWriter, error) {
				s.settled = true // no response the middleware sees: Finish keeps the units
				return next()
			}
		},
	}
}
