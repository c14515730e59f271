package decision

import (
	"strconv"
	"time"
)

// DefaultRetryJitter is CoreConfig.RetryJitter's default: the most random
// time added to a refusal's Retry-After, so that clients refused together
// do not all come back together.
const DefaultRetryJitter = 2 * time.Second

// MaxRetryJitter bounds CoreConfig.RetryJitter.
const MaxRetryJitter = time.Hour

// shedDetail is the problem detail of a shed request.
const shedDetail = "the service is overloaded and sheds this class of request; retry later"

// StatusTitle returns the reason phrase of RFC 9110 for the statuses the
// front ends answer with, the title of their problem bodies; "" for
// others.
func StatusTitle(status int) string {
	switch status {
	case 200:
		return "OK"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 408:
		return "Request Timeout"
	case 413:
		return "Content Too Large"
	case 422:
		return "Unprocessable Content"
	case 429:
		return "Too Many Requests"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 502:
		return "Bad Gateway"
	case 503:
		return "Service Unavailable"
	case 504:
		return "Gateway Timeout"
	}
	return ""
}

// AppendProblem appends the RFC 9457 problem body of type about:blank that
// every front end answers a refusal other than a rate limit's with: the
// status, its title (StatusTitle) and detail, a sentence for people,
// escaped as JSON needs. It allocates only to grow dst.
func AppendProblem(dst []byte, status int, detail string) []byte {
	dst = append(dst, `{"type":"about:blank","title":"`...)
	dst = append(dst, StatusTitle(status)...)
	dst = append(dst, `","status":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, `,"detail":"`...)
	dst = appendJSONText(dst, detail)
	return append(dst, `"}`...)
}

// appendJSONText appends s escaped as the inside of a JSON string.
func appendJSONText(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// Refuse renders v's answer when it is not Allowed, as every front end
// sends it: it sets the answer's fields on h (a rate limit's quota fields
// and Retry-After; a shed request's Retry-After) and returns the status
// and the RFC 9457 problem body, to send with ContentTypeProblem; the body
// is the Verdict's and valid until Finish. Retry-After is the release plus
// up to the core's RetryJitter. For an Allowed verdict it returns 200 and
// no body, and sets nothing (see SetFields).
func (v *Verdict) Refuse(h FieldSetter) (status int, body []byte) {
	status = v.Status()
	switch v.Outcome {
	case Allowed:
		return status, nil
	case Limited:
		return status, v.setRefusal(h)
	case Shed:
		v.setRetryAfter(h)
		v.buf = AppendProblem(v.buf[:0], status, shedDetail)
	default:
		v.buf = AppendProblem(v.buf[:0], status, v.Reason)
	}
	return status, v.buf
}
