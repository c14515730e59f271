// Package loadtest feeds a poplimit PoP with traffic and says what it did:
// traces (JSON lines, imported access logs, or generated), an open-loop
// replayer with HDR latency histograms, and an offline mode that runs the
// rules over a trace with the window package's own limiter and no server.
//
// # Traces
//
// A trace is a stream of requests in time order (type Trace, an iterator:
// nothing is held in memory but the request at hand). The native format is
// JSON lines, one request per line:
//
//	{"offset_ms":1500.25,"ts":"2024-05-07T10:00:01.50025Z","ip":"203.0.113.7","method":"POST","host":"api.example.com","path":"/v1/login?x=1","headers":{"X-API-Key":"k1"},"count":3}
//
//	field      type               required  meaning
//	offset_ms  number ≥ 0         one of    when the request is due, in milliseconds from the trace's
//	                              the two   origin (decimals to the nanosecond); at most 10 years
//	ts         RFC 3339 string              the request's absolute time; a line with ts and no
//	                                        offset_ms is due at ts minus the origin, which the first
//	                                        line carrying a ts fixes (its ts minus its offset_ms)
//	ip         string             yes       the client address, IPv4 or IPv6 (no zone); the key of
//	                                        per-client rules, sent in X-Forwarded-For by a replay
//	method     string             no        an HTTP method token; default GET
//	host       string             no        the Host header; default the replay target's host:port
//	path       string             no        the request target, path and query, starting with "/",
//	                                        printable ASCII (percent-encode the rest); default "/"
//	headers    object of strings  no        extra headers, at most 64 (not Host, Content-Length,
//	                                        Transfer-Encoding or Connection; no CR, LF or NUL)
//	count      integer ≥ 1        no        identical requests due at that instant; default 1
//	duration_ms number ≥ 0        no        how long the request took to answer; the offline
//	                                        simulator holds its concurrency slots that long
//
// Lines are in time order; a line due before the previous one is sent (and
// simulated) at once, as late. Unknown fields are ignored, so traces can carry
// annotations. Blank lines are skipped; a malformed line (or one longer than
// MaxLineBytes) is a *LineError with its number and a reason, skipped,
// counted, never fatal. Writer writes this format with headers in sorted
// order, so equal traces are equal bytes.
//
// Importer reads Apache and nginx access logs in Common or Combined Log
// Format into the same requests (see ParseCLF for the tolerated variants,
// lines cut off inside their user agent among them), puts lines logged out
// of time order back in order (a log of up to ImportConfig.MaxBuffered
// good lines, 1,000,000 by default, is sorted whole; past that, within a
// window that grows to the largest disorder seen), and counts good, bad
// (by reason), cut-off and late lines in an ImportSummary.
//
// The generators (Zipf, Abuser, Burst, Flood, Stuffing, and Mix of them)
// are seeded: one seed, one trace, byte for byte, on every platform. They
// generate lazily, in constant memory (Stuffing holds the clients between
// their attempts).
//
// # Replays
//
// Replay is open-loop: every request leaves at start + offset/speed whether
// or not earlier ones were answered, and its latency runs from that
// scheduled instant, so a stalled server shows as latency instead of
// silently slowing the load (coordinated omission). What bounds it is
// MaxOutstanding: a request due while that many are unanswered is not sent
// and is counted as such. Latencies go into HDR histograms (1 µs to 60 s,
// three significant digits); the report gives p50, p90, p99, p99.9 and max,
// the scheduled, sent and completed rates, the statuses, and per rule the
// allowed and limited requests, read from each response's RateLimit field
// (or a 429's problem body). It ends with the aggregator's JSON report when
// given its URL.
//
// A replay starts at once, at whatever phase the wall clock has against
// the rules' window grid (windows start at multiples of their length since
// the Unix epoch), and a sliding-window estimate errs differently at each
// phase. ReplayConfig.Align puts the trace's offset 0 on a multiple of a
// window, and Phase that far past one (loadtest replay -align 10s -phase
// 2.5s; offline -phase 2.5s simulates the same phase); the report gives
// the phase used.
//
// ReplayConfig.Results (loadtest replay -results FILE) receives one
// tab-separated line per request due, after the header ResultsHeader:
//
//	column         meaning
//	index          the request's number among those due, from 0
//	edge           the target it went to, host:port
//	scheduled_ns   when it was due, Unix ns
//	sent_ns        when it was handed to the connection pool, Unix ns ("-": not sent)
//	answered_ns    when its response or transport error came, Unix ns ("-": not sent)
//	client         the client address sent (X-Forwarded-For)
//	method         the method sent
//	host           the Host header sent
//	target         the request target sent (path prefix, path and query)
//	status         the HTTP status (0: transport error or not sent)
//	outcome        answered, not-sent, timeout, no-free-connection,
//	               connection-refused, connection-closed or error
//	rule           the deciding rule: RateLimit's policy, or a 429 body's
//	limit          RateLimit-Policy's q, else X-RateLimit-Limit
//	remaining      RateLimit's r, else X-RateLimit-Remaining
//	reset_s        RateLimit's t, else X-RateLimit-Reset minus the answer's time
//	window_s       RateLimit-Policy's w
//	retry_after_s  Retry-After
//
// A field with nothing to say is "-". Lines are in the order requests end;
// they are written by one goroutine in 64 KiB chunks, off the request
// path. RESULTS.md has the details and examples.
//
// # Offline
//
// Offline answers "what would these rules have limited in this log?" by
// running them over a trace in simulated time, through the same
// window.Limiter and the same request path as the edge (matching, key
// recipes, block cache, shadow rules), and reports per rule the requests and
// keys limited and the most limited keys with the time of their first
// refusal. Its decisions are those of one edge fed the trace exactly on
// time. A live replay delivers each request a little late (its send lag
// plus the network); the two agree decision for decision except where that
// delay carries a request across a window edge or across its key's release
// time, and where such a difference changes the key's later counts.
//
// # What it does not do
//
// It does not start edges, stores or aggregators (deploy/ and the tests do),
// it sends no request bodies, and it speaks plain HTTP/1.1 only.
package loadtest
