// Package judge measures how accurate the edges' rate-limit decisions were:
// it replays every decision event, in event-time order, against the exact
// sliding-window truth of package window's SlidingLog, and counts the
// decisions that the truth contradicts.
//
// It is pure: time is the events' own (Unix nanoseconds) and the arrival
// time its caller passes, nothing reads a clock, starts a goroutine or does
// I/O, so a scripted trace gives the same answer every time. The aggregator
// (package main beside it) feeds it from Kafka, calls Advance as its clock
// ticks and Flush when the stream has gone quiet.
//
// # Order: a watermark with allowed lateness
//
// A key's events come from several edges, each in its own order, and
// interleave in arrival order. The judge buffers events (a min-heap by time)
// and releases them in time order once the watermark — the latest event
// time seen minus Config.AllowedLateness — has passed them (t ≤ watermark).
// Every released event is judged against the state of its key, which has
// seen exactly the key's events released before it.
//
// An event is late when judging it in order is no longer possible: its key
// has already judged a later event (it arrived after the watermark passed
// that one), or its key has no state and the event is older than the state
// of an expired key could have covered (see Forgotten below). A late event
// is counted (Report.Late, by edge and reason) and not judged, since the
// state it would be judged against already holds its future; its units are
// still logged, at the latest instant its key has seen, so that the
// decisions after it count it (the log clamps out-of-order instants). Late
// is per key, not global: an event behind the watermark whose key has
// judged nothing later is judged exactly, so a partition that lags the
// others does not make its events late.
//
// Kafka orders a key's events within its partition (in the order the edges
// produced them, so within a few milliseconds of time order), but not
// across partitions, and the watermark follows the partition furthest
// ahead. While the consumer catches up (a backlog after a restart, or a
// lagging partition), events arrive already behind the watermark, and
// judging them on arrival would turn that small disorder between two edges
// into late events. So an event also waits Config.Hold (default 250 ms) of
// arrival time — the caller's clock, passed to Add and Advance — which
// gives its neighbours in the partition time to arrive. In steady state
// the lateness keeps events longer and the hold never binds.
//
// When more than Config.MaxBuffered events wait, the oldest is released
// before the watermark reaches it (counted as a buffer overflow); events of
// its key that arrive later and older than it become late.
//
// # What is judged, and against what
//
// Per key (rule, key hash) the judge keeps two logs: admitted units (events
// with Decision Allowed) and attempted units (every event). With L the
// event's Limit, W its window, c its Cost and t its time:
//
//   - throttle, allowed: wrongly allowed iff admitted(t−W, t] + c > L — the
//     promise "never more than L per window" was broken by this admission.
//   - throttle, limited (from the limiter or the block cache): wrongly
//     limited iff attempted(t−W, t] + c ≤ L — a client that had sent no
//     more than L, this one included, was refused.
//   - block, allowed: wrongly allowed iff attempted(t−W, t] + c > L.
//   - block, limited from the block cache: inside a block the rule's
//     timeout intends, correct by definition.
//   - block, limited by the limiter (a block starting): wrongly limited iff
//     attempted(t−W, t] + c ≤ L.
//
// Here admitted(t−W, t] and attempted(t−W, t] count the units logged
// before this event (earlier events at the same instant included), so "+ c"
// is "counting this one". Note what wrongly limited does not mean: a throttle
// client refused while its admitted count had room, but whose attempts
// (refused ones included) exceed L, is not counted — it did send more than L.
//
// Shadow events (the rule only logs) are judged the same way and reported
// apart. Fallback events (decided by the rule's failure policy because the
// store was down) are logged and judged too, but reported apart and left out
// of the accuracy ratio, the overshoot, the relative error and the key
// lists: no count decided them, so they measure the policy, not the counter.
// An event with Limit 0 or WindowMillis 0 cannot be judged: it is counted as
// invalid and otherwise ignored.
//
// # The figures
//
//   - Ratios: wrong / decisions over enforced decisions, where decisions is
//     every judged enforced decision (allowed and limited), as Cloudflare's
//     0.003 % is over all requests.
//   - Overshoot: for every wrongly allowed enforced decision, the exact
//     count it compared with L, divided by L (so > 1): one request over a
//     limit of 10 is 1.1, twice the limit 2.
//   - Mean relative error: over enforced and shadow decisions made by the
//     limiter (not the block cache, whose events carry no estimate; not
//     fallbacks), and whose exact reference count E is > 0, the mean of
//     |Estimate − E| / E. E is what the edge's Estimate stands for, the
//     units in the window before this request: admitted(t−W, t] for
//     throttle, attempted(t−W, t] for block.
//   - Keys: every key with a wrongly allowed (false negative) or wrongly
//     limited (false positive) enforced decision, with its count of wrong
//     decisions and how far from the limit it was: for false negatives the
//     largest exact/L, for false positives the smallest (the most clearly
//     wrong refusal).
//
// # Time resolution
//
// Event times are floored to Config.Resolution (default 1 ms, the unit
// rule windows are written in) before they are logged or compared, so
// units logged within one resolution step share a log entry. The judge is
// exact for the floored trace; two events less than a step apart across a
// window boundary may be judged as if simultaneous.
//
// # Bounded memory
//
// A key's state lives while the key is active: it is removed once the
// latest judged time is two of its windows past the key's last event
// (counted as an idle eviction; its logs are empty by then). The latest
// such expiry horizon (last event + W) is remembered as Forgotten: an event
// of a key without state older than it is late, since an expired state might
// have mattered to it. Besides, Config.MaxKeys bounds the keys and
// Config.MaxLogEntries the log entries of all keys together; past either,
// the least recently active key is evicted (counted; a key evicted while
// active is judged afresh if it returns, which undercounts its window). A
// key's logs hold at most W/Resolution entries each. The buffer is bounded
// by MaxBuffered, the lists of wrong keys by MaxWrongKeys each (past it, the
// less severe half is dropped and the distinct counts become upper bounds),
// and rule and edge label values by MaxRules and MaxEdges (past them, events
// are tallied under "_other"; their keys stay distinct).
//
// # What it does not do
//
// It deduplicates only within Config.Dedup events (off by default): an exact
// copy of a recent event (a batch a producer wrote twice, or the consumer
// read again after a commit was cut off) is dropped and counted, but an
// event replayed to a new process after a crash is judged again (the
// aggregator remembers between 131,072 and 262,144 of the latest events). It
// does not know a key's history from before it started: after a restart,
// each key's first window is judged against the events since then only. It
// does not correct for sampling (a sampled key's events are all there, so
// per-key verdicts need none).
//
// # Concurrency
//
// A Judge is safe for concurrent use: one mutex serializes Add, Advance,
// Flush, Report and the metrics collector. Add holds it for a whole batch.
package judge
