package httpedge

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/poplimit/poplimit/decision"
)

// DecideRequest is the body of POST /_poplimit/decide: may Key do Cost more
// under Rule? The answer counts like any request.
type DecideRequest struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	Cost uint64 `json:"cost"` // 1 or more; absent: the rule's cost
}

// DecideResponse is the answer of POST /_poplimit/decide.
type DecideResponse struct {
	Allowed      bool   `json:"allowed"`
	Rule         string `json:"rule"`
	Limit        uint64 `json:"limit"`
	Remaining    uint64 `json:"remaining"`
	ResetMillis  int64  `json:"reset_ms"`       // until the current window ends
	RetryMillis  int64  `json:"retry_after_ms"` // refused only: until a request of this cost fits
	FromBlocks   bool   `json:"from_block_cache"`
	FallbackUsed bool   `json:"fallback"`
	// Reservation is the id of the units a counting rule (count:)
	// reserved for an allowed request: settle it with POST
	// /_poplimit/settle?id=…&status=… once the response is known (it is
	// also in the Poplimit-Reservation header). Empty for other rules.
	Reservation string `json:"reservation,omitempty"`
}

const maxJSONKey = 4096

// decideFields are the members of a decide request, as they must be
// spelled: exactly, each at most once.
var decideFields = [...]string{"rule", "key", "cost"}

// notDecideJSON is the problem detail of a body that is not one JSON
// object.
const notDecideJSON = "the body is not a JSON decide request"

// parseDecide reads a decide request's body into req. It returns the
// problem detail of a body it refuses, naming the field at fault:
//
//   - a member given twice, or under a name that differs from rule, key or
//     cost only in case (RULE, Key, or with U+212A KELVIN SIGN or U+017F
//     LONG S, which Unicode folds to k and s): encoding/json takes the
//     last of them and matches names without regard to case, so
//     {"rule":"api","RULE":"big"} would be decided under big while a
//     proxy or log in front reads api;
//   - a key or rule that is not a JSON string, or that is not UTF-8 text
//     (invalid bytes, or a \u escape of half a surrogate pair):
//     encoding/json would decode each of those to U+FFFD, so that distinct
//     keys would share a counter;
//   - a cost that is not a whole number of at least 1: 0 is refused
//     rather than read as the rule's cost (which spends) or as a check that
//     spends nothing (which the endpoint does not offer).
//
// Other members are ignored, once each; null is an absent member.
func parseDecide(body []byte, req *DecideRequest) (detail string) {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return notDecideJSON
	}
	var seen [len(decideFields)]bool
	var others []string
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return notDecideJSON
		}
		name, _ := t.(string)
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return notDecideJSON
		}
		i := slices.Index(decideFields[:], name)
		if i < 0 {
			for _, f := range decideFields {
				if strings.EqualFold(name, f) {
					return f + " is also given under a name that differs only in case; field names are lower case, each given once"
				}
			}
			if slices.Contains(others, name) {
				return plainName(name) + " is given more than once; give each field once"
			}
			others = append(others, name)
			continue
		}
		if seen[i] {
			return decideFields[i] + " is given more than once; give each field once"
		}
		seen[i] = true
		if string(raw) == "null" { // absent, as encoding/json has null
			continue
		}
		switch i {
		case 0, 1:
			dst := &req.Rule
			if i == 1 {
				dst = &req.Key
			}
			if raw[0] != '"' {
				return decideFields[i] + " must be a JSON string"
			}
			if !exactJSONString(raw) {
				return decideFields[i] + " is not UTF-8 text: it holds invalid bytes or half a surrogate pair"
			}
			if err := json.Unmarshal(raw, dst); err != nil {
				return decideFields[i] + " must be a JSON string"
			}
		case 2:
			n, err := strconv.ParseUint(string(raw), 10, 64)
			if err != nil || n == 0 {
				return "cost must be a whole number of at least 1 (0 is refused: it is neither the rule's cost nor a free check)"
			}
			req.Cost = n
		}
	}
	if _, err := d.Token(); err != nil { // the closing brace
		return notDecideJSON
	}
	if _, err := d.Token(); err != io.EOF {
		return notDecideJSON // trailing data
	}
	return ""
}

// plainName returns a member name for a problem detail: itself when it
// needs no JSON escaping and is short, else a description.
func plainName(name string) string {
	if name == "" || len(name) > 64 {
		return "a member name"
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return "a member name"
		}
	}
	return name
}

// exactJSONString reports whether raw, a JSON string token (quotes
// included) that encoding/json has accepted, decodes to exactly the text
// it spells: its bytes are UTF-8 and every \u escape of a surrogate is the
// high half followed by an escaped low half.
func exactJSONString(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++ // the escaped character; a backslash escapes only it
		if i+4 >= len(raw) || raw[i] != 'u' {
			continue
		}
		r := hex4(raw[i+1 : i+5])
		i += 4
		if !utf16.IsSurrogate(r) {
			continue
		}
		// A high half, then \uXXXX holding a low half.
		if r >= 0xdc00 || i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
			return false
		}
		if lo := hex4(raw[i+3 : i+7]); lo < 0xdc00 || lo > 0xdfff {
			return false
		}
		i += 6
	}
	return true
}

// hex4 decodes four hexadecimal digits; -1 if one is not.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

func (s *Server) handleDecideJSON(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, "POST")
		writeProblem(ctx, fasthttp.StatusMethodNotAllowed, "use POST")
		return
	}
	in := ctx.PostBody()
	if len(in) > s.cfg.MaxDecisionBody { // the served edge refuses it before reading (readRefusal); Handler's callers may not
		s.bodyTooLarge(ctx)
		return
	}
	var req DecideRequest
	if detail := parseDecide(in, &req); detail != "" {
		writeProblem(ctx, fasthttp.StatusBadRequest, detail)
		return
	}
	if req.Key == "" || len(req.Key) > maxJSONKey {
		writeProblem(ctx, fasthttp.StatusBadRequest, "key must be 1 to 4096 bytes")
		return
	}
	now := s.now()
	t := now.UnixNano()
	g := s.core.Current()
	index, cost := -1, req.Cost
	if r := g.Rules().Lookup(req.Rule); r != nil {
		index = r.Index
		if cost == 0 {
			cost = r.Cost // the rule's own cost
		}
	}
	d := s.core.DecideKey(g, now, index, unsafeBytes(req.Key), cost, 0)
	defer s.core.Finish(d)
	if d.Outcome == decision.Undecidable || d.Outcome == decision.Denied {
		writeRefusal(ctx, d) // 404, 422 or 400 with the core's problem body
		return
	}
	q := &d.Quota
	resp := DecideResponse{Allowed: d.Outcome == decision.Allowed, Rule: q.Rule.Name, Limit: q.Limit, Remaining: q.Remaining,
		ResetMillis: max(0, (q.ResetAt-t)/int64(time.Millisecond)), FromBlocks: d.FromBlockCache,
		FallbackUsed: d.Fallback}
	if d.Outcome == decision.Allowed && d.Counting() {
		var room [decision.ReservationIDLen]byte
		if id, ok := s.core.Hold(d, room[:0]); ok {
			resp.Reservation = string(id)
			ctx.Response.Header.SetBytesV(ReservationHeader, id)
		}
	}
	if d.Outcome == decision.Limited {
		resp.RetryMillis = max(0, (q.ReleaseAt-t+int64(time.Millisecond)-1)/int64(time.Millisecond))
		// The fields and Retry-After of the proxy's refusal; the body is
		// this endpoint's own.
		status, _ := d.Refuse(&ctx.Response.Header)
		ctx.SetStatusCode(status)
	}
	body, _ := json.Marshal(resp)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// unsafeBytes views s as bytes that must not be modified.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
