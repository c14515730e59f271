package judge

// The memory the judge's state takes, in bytes, per unit of the bounds of
// Config (64-bit platforms). TestMemoryBound measures them under a flood
// of keys, and Config.MemoryBound adds them up.
const (
	// BytesPerKey is a key's state and its index entry, without its logs:
	// at most MaxKeys of them.
	BytesPerKey = 384
	// BytesPerLogEntry is an entry of room in a sliding-log ring: at most
	// MaxLogEntries of them, all keys together. A key of a sliding_window
	// or sliding_log rule keeps two logs of at least 8 entries each once
	// it has logged a unit: 256 bytes, or 16 of MaxLogEntries.
	BytesPerLogEntry = 16
	// BytesPerBuffered is an event waiting for the watermark: at most
	// MaxBuffered of them.
	BytesPerBuffered = 104
	// BytesPerDedup is a fingerprint remembered: Dedup of them.
	BytesPerDedup = 16
	// BytesPerWrongKey is a key remembered with wrong decisions: at most
	// MaxWrongKeys per list, two lists.
	BytesPerWrongKey = 160
)

// MemoryBound returns the most memory, in bytes, the state of a Judge of
// this configuration takes (what a heap profile after a collection shows;
// the Go runtime's garbage comes on top, see GOMEMLIMIT). Rules, edges and
// PoPs (MaxRules, MaxEdges) add a few bytes each and are not counted.
func (c *Config) MemoryBound() int64 {
	return int64(c.MaxKeys)*BytesPerKey + int64(c.MaxLogEntries)*BytesPerLogEntry +
		int64(c.MaxBuffered)*BytesPerBuffered + int64(c.Dedup)*BytesPerDedup +
		2*int64(c.MaxWrongKeys)*BytesPerWrongKey
}
