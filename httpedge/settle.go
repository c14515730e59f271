package httpedge

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
)

// Settling counting rules (rules with count:) in decision mode. The edge
// answers nginx's auth_request, Caddy's forward_auth or Envoy's ext_authz
// before the origin does, so it cannot see the response: an admitted
// request that reserved units under a counting rule is answered with the
// reservation's id in ReservationHeader, and whoever learns the response
// (the origin, or a proxy that can call after it) settles it with
//
//	POST /_poplimit/settle?id=<id>&status=<status>[&units=<n>]
//
// units is the origin's cost header's value, for rules that count by one.
// The edge answers 204 when it settled the reservation, 404 when it holds
// none of that id (settled already, kept at its timeout, or issued by
// another edge), 400 for a bad status. A reservation not settled within
// the settle timeout keeps its units (decision.CoreConfig.SettleTimeout).
// With a DecideToken the call needs it as a bearer token, as the decide
// endpoint does.

// ReservationHeader carries a decision-mode reservation's id in the
// edge's answer to a check (and a proxy may pass it on to the origin).
const ReservationHeader = "Poplimit-Reservation"

// settlePath is the settle endpoint in decision mode.
const settlePath = "/_poplimit/settle"

// responseFields reads a fasthttp response's header for the core's
// counting rules (decision.ResponseHeader).
type responseFields struct{ h *fasthttp.ResponseHeader }

func (f responseFields) ResponseHeader(name string) ([]byte, bool) {
	v := f.h.Peek(name)
	return v, v != nil
}

// unitsField answers a counting rule's cost header with the units a
// settle call sent, whatever the header's name.
type unitsField struct{ v []byte }

func (f *unitsField) ResponseHeader(string) ([]byte, bool) { return f.v, f.v != nil }

// hold moves a counting request's reserved units into the core's table of
// reservations and answers with its id.
func (s *Server) hold(ctx *fasthttp.RequestCtx, d *decision.Verdict) {
	var room [decision.ReservationIDLen]byte
	if id, ok := s.core.Hold(d, room[:0]); ok {
		ctx.Response.Header.SetBytesV(ReservationHeader, id)
	}
}

// handleSettle serves the settle endpoint.
func (s *Server) handleSettle(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeProblem(ctx, fasthttp.StatusMethodNotAllowed, "the settle endpoint takes POST")
		return
	}
	if s.cfg.DecideToken != "" && !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="poplimit decide"`)
		writeProblem(ctx, fasthttp.StatusUnauthorized, "the settle endpoint needs the decide endpoint's bearer token")
		return
	}
	args := ctx.QueryArgs()
	status, err := strconv.Atoi(string(args.Peek("status")))
	if err != nil || status < 100 || status > 599 {
		s.core.RefusedSettle()
		writeProblem(ctx, fasthttp.StatusBadRequest, "status must be the response's status code, 100 to 599")
		return
	}
	u := unitsField{v: args.Peek("units")}
	if !args.Has("units") {
		u.v = nil
	}
	if !s.core.SettleHeld(args.Peek("id"), status, &u) {
		writeProblem(ctx, fasthttp.StatusNotFound, "the edge holds no reservation of that id: settled already, kept at its timeout, or issued by another edge")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
