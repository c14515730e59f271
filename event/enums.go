package event

import "strconv"

// Admission is what the edge decided for one request: admitted or
// limited, the event's flag bit 0 (FORMAT.md). The zero value is Allowed.
type Admission uint8

const (
	Allowed Admission = iota // the request went through
	Limited                  // the request was refused (429)
)

func (d Admission) String() string {
	switch d {
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	}
	return "Admission(" + strconv.Itoa(int(d)) + ")"
}
