//go:build unix

package edge

import (
	"fmt"
	"syscall"
)

func raiseFileLimit() (FileLimit, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return FileLimit{}, fmt.Errorf("edge: getrlimit: %w", err)
	}
	if r.Cur < r.Max {
		want := r
		want.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return FileLimit{Soft: uint64(r.Cur), Hard: uint64(r.Max)}, fmt.Errorf("edge: setrlimit NOFILE to %d: %w", r.Max, err)
		}
		r = want
	}
	return FileLimit{Soft: uint64(r.Cur), Hard: uint64(r.Max)}, nil
}

func fileLimit() (FileLimit, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return FileLimit{}, fmt.Errorf("edge: getrlimit: %w", err)
	}
	return FileLimit{Soft: uint64(r.Cur), Hard: uint64(r.Max)}, nil
}
