package loadtest

import (
	"bytes"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

type ruleCounter struct{ allowed, limited atomic.Int64 }

// rule returns the counter of the rule named name, creating it.
func (rp *replayer) rule(name []byte) *ruleCounter {
	rp.rulesMu.Lock()
	defer rp.rulesMu.Unlock()
	if c, ok := rp.rules[string(name)]; ok {
		return c
	}
	key := string(name)
	if len(rp.rules) >= maxRuleKeys {
		key = "(other)"
		if c, ok := rp.rules[key]; ok {
			return c
		}
	}
	c := &ruleCounter{}
	rp.rules[key] = c
	return c
}

var (
	hRateLimit = []byte("RateLimit")
	policyKey  = []byte(`"policy":"`)
)

// ruleOf returns the name of the rule that decided resp: the first policy
// of its RateLimit field (an sf-string), else the "policy" of a 429's
// problem body. The slice aliases resp.
func ruleOf(resp *fasthttp.Response) []byte {
	if v := resp.Header.PeekBytes(hRateLimit); len(v) > 0 {
		if name, ok := sfString(v); ok {
			return name
		}
	}
	if resp.StatusCode() == fasthttp.StatusTooManyRequests {
		body := resp.Body()
		if i := bytes.Index(body, policyKey); i >= 0 {
			rest := body[i+len(policyKey):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				return rest[:j]
			}
		}
	}
	return nil
}

// sfString returns the sf-string that v (a structured-field list) starts
// with, as the RateLimit fields name their policy: `"name";r=…`. Rule names
// need no escapes; an escaped one is returned as it stands.
func sfString(v []byte) ([]byte, bool) {
	v = bytes.TrimLeft(v, " ")
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	for i := 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return v[1:i], true
		}
	}
	return nil, false
}
