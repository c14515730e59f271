package loadtest

import (
	"bufio"
	"errors"
	"io"
)

// MaxLineBytes is the longest trace or log line read; a longer line is
// reported as bad and skipped, so one broken line costs bounded memory.
const MaxLineBytes = 64 << 10

// lineReader reads lines of at most MaxLineBytes, numbering them from 1.
type lineReader struct {
	br   *bufio.Reader
	line int
	done bool
}

func newLineReader(r io.Reader) lineReader {
	return lineReader{br: bufio.NewReaderSize(r, MaxLineBytes)}
}

// next returns the next line without its "\n" or "\r\n", valid until the
// next call; tooLong reports a line longer than MaxLineBytes, returned
// empty. err is io.EOF at the end, or the reader's error.
func (lr *lineReader) next() (line []byte, tooLong bool, err error) {
	if lr.done {
		return nil, false, io.EOF
	}
	b, err := lr.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		lr.line++
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = lr.br.ReadSlice('\n')
		}
		if err != nil && err != io.EOF {
			return nil, false, err
		}
		lr.done = err == io.EOF
		return nil, true, nil
	}
	if err == io.EOF {
		lr.done = true
		if len(b) == 0 {
			return nil, false, io.EOF
		}
	} else if err != nil {
		return nil, false, err
	}
	lr.line++
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b, false, nil
}
