// Package filestamp identifies the contents of files that are watched for
// changes (the rules files, envoyproxy/ratelimit's configuration
// directory, TLS certificates): a stamp names each file with a hash and
// the length of its bytes, so two stamps are equal when the same files
// hold the same bytes, whatever their modification times say.
package filestamp

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Append appends the stamp of the file name holding data to b.
func Append(b []byte, name string, data []byte) []byte {
	b = append(b, name...)
	b = append(b, ':')
	b = strconv.AppendUint(b, xxhash.Sum64(data), 16)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(len(data)), 10)
	return append(b, ';')
}
