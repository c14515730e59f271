package rls

import (
	"bytes"
	"unsafe"

	"github.com/poplimit/poplimit/decision"
)

// Counting rules through Envoy. A descriptor whose limit has the count
// extension (rules/envoyconf) reserves its hits when Envoy asks on the
// request path, as every counted descriptor does; an admitted request's
// reservation is held on this edge and its id returned in
// request_headers_to_add (ReservationHeader), which Envoy adds to the
// request it sends upstream. The route's second rate limit, applied when
// the stream is done (apply_on_stream_done), sends one descriptor
// [(ReservationKey, the header's value)] with hits_addend
// "%RESPONSE_CODE%": the response's status settles the reservation, as
// POST /_poplimit/settle does. A status under 100 (Envoy's 0: no
// response, the client went away) keeps the units; a reservation no
// stream-done call settles keeps them at the settle timeout. The settle
// descriptor is answered OK and counts nothing. SERVICE.md in
// rules/envoyconf gives the route configuration.

// ReservationHeader is the request header the service asks Envoy to add
// with the reservations of a request's counting descriptors, comma
// separated.
const ReservationHeader = "poplimit-reservation"

// ReservationKey is the descriptor key of a stream-done settle call.
const ReservationKey = "poplimit_reservation"

// hold moves a counting descriptor's reserved hits into the core's
// reservations and appends the id to the header being built.
func (s *Service) hold(sc *rlsScratch, v *decision.Verdict) {
	mark := len(sc.resBuf)
	if mark > 0 {
		sc.resBuf = append(sc.resBuf, ',')
	}
	if b, ok := s.core.Hold(v, sc.resBuf); ok {
		sc.resBuf = b
	} else {
		sc.resBuf = sc.resBuf[:mark]
	}
}

// settle settles each reservation of ids (comma separated) with status.
func (s *Service) settle(ids string, status uint64) {
	b := unsafeBytes(ids)
	for len(b) > 0 {
		id := b
		if i := bytes.IndexByte(b, ','); i >= 0 {
			id, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		st := int(min(status, 1000))
		s.core.SettleHeld(bytes.TrimSpace(id), st, nil)
	}
}

// unsafeBytes views s as bytes that must not be modified.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
