package rls

import (
	"strconv"
	"time"
	"unsafe"

	"github.com/poplimit/poplimit/decision"
)

// Header names of response_headers_to_add.
const (
	hdrPolicy     = "RateLimit-Policy"
	hdrRateLimit  = "RateLimit"
	hdrRetryAfter = "Retry-After"
	hdrRLLimit    = "RateLimit-Limit"
	hdrRLRemain   = "RateLimit-Remaining"
	hdrRLReset    = "RateLimit-Reset"
)

// headers writes the response headers of descriptor ds into sc.resp. Their
// values are views of sc.hbuf, which lives as long as the response.
func (s *Service) headers(sc *rlsScratch, ds *rlsDesc, over bool, retryAt int64, now time.Time) {
	b := sc.hbuf[:0]
	k := 0
	mark := func(start int) {
		sc.hoff[k] = [2]int{start, len(b)}
		k++
	}
	t := decision.Seconds(ds.reset)
	var keys [4]string
	if s.cfg.Headers == HeadersRatelimit {
		keys = [4]string{s.cfg.LimitHeader, s.cfg.RemainingHeader, s.cfg.ResetHeader}
		st := len(b)
		b = strconv.AppendUint(b, uint64(ds.m.RequestsPerUnit), 10)
		mark(st)
		st = len(b)
		b = strconv.AppendUint(b, uint64(ds.remaining), 10)
		mark(st)
		st = len(b)
		b = strconv.AppendInt(b, t, 10)
		mark(st)
	} else {
		keys = [4]string{hdrPolicy, hdrRateLimit, hdrRetryAfter}
		st := len(b)
		b = decision.AppendPolicyItem(b, ds.policy, uint64(ds.m.RequestsPerUnit), ds.policyWindow)
		mark(st)
		st = len(b)
		b = decision.AppendRateLimitItem(b, ds.policy, uint64(ds.remaining), ds.reset)
		mark(st)
		if over {
			// The core's Retry-After, jitter included, but never before
			// the RateLimit t of the descriptor chosen.
			tn := now.UnixNano()
			ra := max(decision.RetryAfter(retryAt, tn, s.core.RetryJitter()), t)
			st = len(b)
			b = strconv.AppendInt(b, ra, 10)
			mark(st)
		}
	}
	sc.hbuf = b
	for i := 0; i < k; i++ {
		h := &sc.hdrs[i]
		h.Key, h.RawValue = keys[i], nil
		h.Value = bytesView(b[sc.hoff[i][0]:sc.hoff[i][1]])
		sc.hdrPtrs[i] = h
	}
	sc.resp.ResponseHeadersToAdd = sc.hdrPtrs[:k]
}

// bytesView returns b as a string without copying: b must not change while
// the string is in use (here: until the response is marshaled).
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
