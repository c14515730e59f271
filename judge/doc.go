// Package judge measures how accurate the edges' rate-limit decisions
// were: it replays every decision event, in event-time order, against the
// exact reference of the event's own algorithm, and counts the decisions
// that the reference contradicts.
//
// It is pure: time is the events' own and the arrival time its caller
// passes (Add, Advance); nothing reads a clock, starts a goroutine or does
// I/O, so a scripted trace gives the same answer every time.
//
// Order. Events are buffered and released in time order once the
// watermark (the latest event time minus Config.AllowedLateness) has
// passed them and they have waited Config.Hold of arrival time. An event
// whose key already judged a later one, or whose key's expired state might
// have covered it, is late: counted by edge and reason, not judged, its
// units still logged. An event stamped more than AllowedLateness +
// Config.MaxClockSkew after the caller's clock, or more than
// Config.MaxEventAge before it, or with parameters no reference can hold
// (limit or window 0, a bucket beyond its exact arithmetic), is invalid:
// counted by reason, and otherwise ignored (0 turns either time bound off).
//
// References. Per key (rule, key hash) the judge keeps two histories of
// what happened, admitted units and attempted units, and the reference of
// the key's algorithm: an exact sliding log for sliding_window and
// sliding_log (H(t−W, t] + c ≤ L), windows aligned on Unix time for
// fixed_window, an exact GCRA of rate L per W and capacity Burst for
// token_bucket and leaky_bucket. Every algorithm is shared by the PoP's
// edges, so every key is held to one limit over all edges' events. A
// throttle admission is wrongly allowed when the admitted history did not
// admit its cost c; a throttle refusal is wrongly limited when the
// attempted history did admit it. A block admission is judged against the
// attempted history; a block refusal from the block cache is correct, one
// that starts a block is wrongly limited when the attempted history
// admitted it. A Delayed event is judged as an admission at its served
// time. A key whose algorithm changes starts the new reference empty.
//
// Counting by response. A rule that counts by response (event.Event's
// Counting) is judged against the exact count of the units its key's
// responses counted, each logged at its request's arrival whenever it
// settled: a request is wrongly allowed when the key already had its
// limit of counted units in the window when it arrived (with its cost, no
// room left), wrongly limited when it did not, a refusal caused by units
// still reserved that later settled as not counting included (a block
// cache's refusal is inside a block, as above). A limited request counts
// nothing. An admitted request's event is sent when it settles, up to the
// edges' settle timeout after its time, so a counting rule's events are
// released, ordered and expired Config.SettleLateness later than the
// others (the buffer holds them that much longer, under MaxBuffered), and
// FlushSettled, the quiet stream's flush, leaves those not yet that old.
// Within one Resolution tick a counting rule's admissions are judged
// before its refusals: the refusal of a request that raced the one whose
// reserved units refused it is sent first, the admission when it settles.
//
// Figures. Report gives, over enforced decisions (shadow and fallback ones
// apart), the wrong ratios by rule and by algorithm, the overshoot (the
// ratio to the limit of each wrongly allowed decision), the mean relative
// error of the edges' estimates, and the keys most wrong.
//
// Bounds. Times are floored to Config.Resolution. A key's state lives
// until two of its spans (its window, or a bucket's drain time) pass
// without its events; Config.MaxKeys, MaxLogEntries, MaxBuffered,
// MaxWrongKeys, MaxRules and MaxEdges bound memory and label values, and
// every eviction is counted. Config.MemoryBound adds the bounds up in
// bytes (BytesPerKey and its siblings, measured under a flood of keys);
// at the defaults it is about 0.73 GiB.
//
// It deduplicates only within Config.Dedup events not marked Framed, does
// not know a key's history from before it started, and does not correct
// for sampling (a sampled key's events are all there).
//
// A Judge is safe for concurrent use: one mutex serializes Add, Advance,
// Flush, Report and the metrics collector.
package judge
