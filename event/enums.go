package event

import "strconv"

// Decision is what the edge decided for one request. The zero value is
// Allowed.
type Decision uint8

const (
	Allowed Decision = iota // the request went through
	Limited                 // the request was refused (429)
)

func (d Decision) String() string {
	switch d {
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}
