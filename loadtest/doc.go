// Package loadtest feeds a poplimit PoP with traffic and says what it did:
// traces (JSON lines, imported access logs, or generated), an open-loop
// replayer with HDR latency histograms, and an offline simulator that runs
// rules over a trace with the edge's own decision core and no server.
// cmd/loadtest is its command; README.md, beside this file, documents the
// trace format and the commands, RESULTS.md the replay's results file.
//
// A Trace is an iterator of requests in time order: nothing is held in
// memory but the request at hand. ReadFile and Reader read JSON lines; a
// malformed line is a *LineError with its number and reason, skipped and
// counted, never fatal; a line due before the previous one is sent (and
// simulated) at once, as late. Writer writes the format canonically, so
// equal traces are equal bytes. Importer reads Common and Combined Log
// Format access logs and puts lines logged out of order back in order
// within ImportConfig.MaxBuffered lines, counting what it could not. The
// generators (Zipf, Abuser, Burst, Flood, Stuffing among them, and Mix of
// any) are seeded, one seed one trace byte for byte on every platform, and
// generate lazily (Stuffing holds its clients between their attempts).
//
// Replay is open-loop: every request leaves at start + offset/speed
// whether or not earlier ones were answered, and its latency runs from
// that scheduled instant, so a stalled server shows as latency instead of
// slowing the load. MaxOutstanding bounds the requests in flight; one due
// past it is counted as not sent. ReplayConfig.Align and Phase start the
// trace at a chosen phase of the rules' window grid. The ReplayReport gives
// latency percentiles, rates, statuses, and per rule the allowed and
// limited requests read from each response's quota fields, then the
// aggregator's report when given its URL. ReplayConfig.Results receives a
// line per request, written off the request path. ReplayConfig.Timeline
// records the replay over time, bounded, and WritePage draws it as one
// self-contained HTML page (internal/plotpage); ReadResults rebuilds the
// report and the timeline from a results file.
//
// Offline runs rules over a trace in simulated time through
// decision.Core, as one edge fed the trace exactly on time would decide
// it, over an in-memory store; it reports per rule the requests and keys
// limited and the most limited keys. A live replay agrees with it decision
// for decision except where a request's delivery delay carries it across a
// window edge or its key's release time. Shed rules, and concurrency rules
// of a trace without durations, are reported as not simulated.
//
// It does not start edges, stores or aggregators (deploy/pop and the
// tests do), send request bodies, or speak anything but plain HTTP/1.1.
package loadtest
