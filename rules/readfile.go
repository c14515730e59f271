package rules

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultMaxFileBytes bounds the size of a rules file, an overrides file
// and each envoyproxy/ratelimit file, unless a reader is given its own
// bound: the YAML parser holds a node of a few hundred bytes per scalar
// of a file while it reads it, so a file's size bounds what reading it
// costs.
const DefaultMaxFileBytes = 4 << 20 // 4 MiB

// ErrTooLarge is wrapped by ReadFile's error for a file over its bound.
var ErrTooLarge = errors.New("too large")

// SizeError is ReadFile's refusal of a file over its bound.
type SizeError struct {
	Path  string
	Size  int64 // as the file's status says; the bytes read so far when it grew while read
	Limit int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%s: %d bytes, over the limit of %d bytes a rules file may hold: too large", e.Path, e.Size, e.Limit)
}

// Unwrap makes errors.Is(err, ErrTooLarge) hold.
func (e *SizeError) Unwrap() error { return ErrTooLarge }

// ReadFile reads the regular file at path (symlinks followed), refusing
// with a *SizeError one that holds more than limit bytes (0 or less:
// DefaultMaxFileBytes) before reading any of it: the size is taken from
// the opened file, and the read itself stops one byte past the limit, so
// a file that grows while it is read is refused too and never costs more
// than limit bytes.
func ReadFile(path string, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultMaxFileBytes
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
	}
	if st.Size() > limit {
		return nil, &SizeError{Path: path, Size: st.Size(), Limit: limit}
	}
	b := make([]byte, 0, st.Size()+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // the file is longer than it said
		}
		n, err := f.Read(b[len(b):min(int64(cap(b)), limit+1)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return nil, &SizeError{Path: path, Size: int64(len(b)), Limit: limit}
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
