package rules

// Matches reports whether a request with this host (without port), method
// and path is under the rule. A rule for GET also meets HEAD, which asks
// for the same resource and which origins (Go's ServeMux, most
// frameworks) route to GET's handler. It does not allocate.
func (r *Rule) Matches(host, method, path []byte) bool {
	if r.Envoy {
		return false
	}
	if r.Host != "" && !EqualFold(host, r.Host) {
		return false
	}
	if r.PathPrefix != "" {
		if len(path) < len(r.PathPrefix) {
			return false
		}
		if r.PathFold {
			if !EqualFold(path[:len(r.PathPrefix)], r.PathPrefix) {
				return false
			}
		} else if string(path[:len(r.PathPrefix)]) != r.PathPrefix {
			return false
		}
	}
	if len(r.Methods) == 0 {
		return true
	}
	for _, m := range r.Methods {
		if string(method) == m || m == "GET" && string(method) == "HEAD" {
			return true
		}
	}
	return false
}

// EqualFold reports whether b and s are equal under ASCII case folding
// (header names, hosts), without allocating.
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
