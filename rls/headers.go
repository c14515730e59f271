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
	t := ceilSeconds(int64(ds.reset))
	var keys [4]string
	if s.cfg.Headers == HeadersRatelimit {
		keys = [4]string{hdrRLLimit, hdrRLRemain, hdrRLReset}
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
		b = appendSFPolicy(b, ds.policy, uint64(ds.m.RequestsPerUnit), ceilSeconds(int64(ds.policyWindow)))
		mark(st)
		st = len(b)
		b = appendSFLimit(b, ds.policy, uint64(ds.remaining), t)
		mark(st)
		if over {
			tn := now.UnixNano()
			ra := max(decision.RetryAfter(retryAt, tn, s.cfg.RetryJitter), t)
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

// appendSFPolicy appends a RateLimit-Policy item: the policy name as an
// sf-string (rule names need no escaping) with q and w.
func appendSFPolicy(dst, name []byte, q uint64, w int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, `";q=`...)
	dst = strconv.AppendUint(dst, q, 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, max(w, 1), 10)
}

// appendSFLimit appends a RateLimit item: the policy name with r and t.
func appendSFLimit(dst, name []byte, r uint64, t int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, name...)
	dst = append(dst, `";r=`...)
	dst = strconv.AppendUint(dst, r, 10)
	dst = append(dst, ";t="...)
	return strconv.AppendInt(dst, t, 10)
}

// bytesView returns b as a string without copying: b must not change while
// the string is in use (here: until the response is marshaled).
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// ceilSeconds returns d nanoseconds rounded up to whole seconds, at least 0.
func ceilSeconds(d int64) int64 {
	if d <= 0 {
		return 0
	}
	return (d + int64(time.Second) - 1) / int64(time.Second)
}
