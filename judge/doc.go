// Package judge measures how accurate the edges' rate-limit decisions were:
// it replays every decision event, in event-time order, against the exact
// truth of the event's own algorithm (package window's SlidingLog for the
// sliding window and the sliding log, its fixed-window alignment for the
// fixed window, GCRA for the token and leaky buckets), and counts the
// decisions that the truth contradicts.
//
// It is pure: time is the events' own (Unix nanoseconds) and the arrival
// time its caller passes (its clock), nothing reads a clock, starts a goroutine or does
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
// # Times no clock could have stamped
//
// The watermark trusts the latest event time, so one event stamped far
// ahead (an edge whose clock jumped) would release every buffered event
// at once, and, once judged, make every other key idle and expired: the
// next events would be judged from empty state. An event whose time is
// more than AllowedLateness + Config.MaxClockSkew (default 5 s) after the
// caller's clock — one that would move the watermark more than
// MaxClockSkew past that clock — is therefore invalid (reason "future").
// One stamped more than Config.MaxEventAge (default 168 h) before the
// clock is invalid too (reason "past"): as a late event its units would
// be logged at its key's latest instant, and counted by the decisions
// after it. Invalid events are counted and otherwise ignored: they move
// no watermark, touch no key's state and make no figure.
//
// The past bound is relative to the clock, not to the watermark, because
// events legitimately far behind the watermark are judged per key (a
// lagging partition, see above), and a consumer catching up after an
// outage reads events as old as the outage is long; the default is
// Kafka's default retention, so nothing a default topic still holds is
// refused. Callers whose arrival times are not a clock of the events'
// epoch (traces judged offline) set both bounds to 0, which turns them
// off.
//
// When more than Config.MaxBuffered events wait, the oldest is released
// before the watermark reaches it (counted as a buffer overflow); events of
// its key that arrive later and older than it become late.
//
// # What is judged, and against what
//
// Per key (rule, key hash) the judge keeps the exact reference of the
// algorithm its events name (Event.Algorithm; version 1 events, which have
// none, are sliding-window events): two histories, admitted units (events
// with Decision Allowed) and attempted units (every event). With L the
// event's Limit, W its window, c its Cost and t its time, a history H
// "admits c at t" when:
//
//   - sliding_window and sliding_log: H(t−W, t] + c ≤ L, H an exact
//     sliding log (the edges estimate the first; the truth of both is the
//     exact log).
//   - fixed_window: H[s, s+W) + c ≤ L, H counted per window, where s =
//     ⌊t/W⌋·W in Unix time: windows start where the edges start them
//     (window.FixedWindow.WindowStart), not at a key's first event.
//   - token_bucket and leaky_bucket: c fits in H as an exact GCRA
//     (window.LeakyBucket) of rate L per W and capacity B, the event's
//     Burst (L when 0): H's level at t plus c is at most B. Equivalently,
//     for every interval [s, t], H[s, t] + c ≤ B + L·(t−s)/W: the bucket's
//     promise. As a meter the leaky bucket admits what the token bucket
//     does, so both are judged alike.
//
// Then, for every algorithm:
//
//   - throttle, allowed: wrongly allowed iff the admitted history does not
//     admit c — the promise ("never more than L per window", "never more
//     than B + rate × t in any t") was broken by this admission.
//   - throttle, limited (from the limiter or the block cache): wrongly
//     limited iff the attempted history admits c — a client that had sent
//     no more than the promise allows, this one included, was refused.
//   - block, allowed: wrongly allowed iff the attempted history does not
//     admit c.
//   - block, limited from the block cache: inside a block the rule's
//     timeout intends, correct by definition.
//   - block, limited by the limiter (a block starting): wrongly limited iff
//     the attempted history admits c.
//
// The histories are of what happened, not of what the truth would have
// done: the admitted history takes every request an edge admitted,
// rightly or wrongly, and the attempted history every request. They hold
// the units of this key's events judged before this one (earlier events at
// the same instant included), so "+ c" is "counting this one", and this
// event's units are added to them whatever the verdict (for a bucket,
// poured even past its capacity). This is the same convention for every
// algorithm. A truth that replayed its own verdicts would part from the
// edges' history at their first mistake and judge every later decision
// against traffic that was never admitted; with the actual history, an
// overshoot keeps later admissions wrong for as long as it breaks the
// promise — a window for the logs, until the bucket has drained back under
// its capacity for a bucket. Note what wrongly limited does not mean: a
// throttle client refused while its admitted history had room, but whose
// attempts (refused ones included) exceed the promise, is not counted — it
// did send more than allowed.
//
// A Delayed event (a leaky-bucket queue held the request DelayMicros and
// then let it through) is judged as an admission at its served time,
// Time + DelayMicros, since that is when it reached the service: what is
// judged is the rate that went through. Its attempt is logged there too.
// The delay does not move the watermark (it follows decision times), and
// how long the queue was is not judged.
//
// The token bucket, the leaky bucket and the sliding log keep their state
// on each edge (see window.Algorithm): a key that several edges serve can
// be admitted up to its limit on each. The judge holds every algorithm to
// the key's limit over all edges' events, so such per-edge admissions beyond
// the one limit are counted wrongly allowed.
//
// A key whose events change algorithm (its rule was edited) starts the new
// algorithm's reference empty, as if the key were new.
//
// Shadow events (the rule only logs) are judged the same way and reported
// apart. Fallback events (decided by the rule's failure policy because the
// store was down) are logged and judged too, but reported apart and left out
// of the accuracy ratio, the overshoot, the relative error and the key
// lists: no count decided them, so they measure the policy, not the counter.
// An event with Limit 0 or WindowMillis 0, or a bucket event whose B × W
// does not fit the bucket's exact arithmetic, cannot be judged: it is
// counted as invalid (reason "parameters") and otherwise ignored.
//
// # The figures
//
//   - Ratios: wrong / decisions over enforced decisions, where decisions is
//     every judged enforced decision (allowed and limited), as Cloudflare's
//     0.003 % is over all requests. Report.ByAlgorithm breaks them down by
//     algorithm, Report.ByRule by rule.
//   - The ratio to the limit of a decision: for the sliding window, the
//     sliding log and the fixed window, the exact count it compared with L
//     (this request included) divided by L: one request over a limit of 10
//     is 1.1, twice the limit 2. For a bucket, over the busy period of the
//     history it was judged against (the interval [b, t] since the bucket
//     was last empty, in which it has held units throughout), the units
//     poured, this request included, divided by what the bucket promises
//     for that interval, B + L·(t−b)/W. It is > 1 exactly when the
//     decision broke the promise (the busy period is the interval that
//     breaks it by the most units), 10 requests at once into an empty
//     bucket of 5 make 2, a key admitted at twice the rate from an empty
//     bucket tends to 2, like a window's count. It costs one instant per
//     bucket; it is the ratio of one interval, so a short burst late in a
//     long busy period can have a higher ratio over a shorter interval.
//   - Overshoot: the distribution of that ratio over the wrongly allowed
//     enforced decisions (so > 1).
//   - Mean relative error: over enforced and shadow decisions made by the
//     limiter (not the block cache, whose events carry no estimate; not
//     fallbacks), and whose exact reference E is > 0, the mean of
//     |Estimate − E| / E. E is what the edge's Estimate stands for, the
//     units before this request: the admitted history's count (window,
//     log) or level (bucket) for throttle, the attempted history's for
//     block.
//   - Keys: every key with a wrongly allowed (false negative) or wrongly
//     limited (false positive) enforced decision, with its count of wrong
//     decisions and how far from the limit it was: for false negatives the
//     largest ratio to the limit, for false positives the smallest (the
//     most clearly wrong refusal).
//
// # Time resolution
//
// Event times are floored to Config.Resolution (default 1 ms, the unit
// rule windows are written in) before they are logged or compared, so
// units logged within one resolution step share a log entry. The judge is
// exact for the floored trace; two events less than a step apart across a
// window boundary may be judged as if simultaneous. Fixed windows align as
// the edges' do as long as the resolution divides the window (the
// default's 1 ms divides every window).
//
// # Bounded memory
//
// A key's state lives while the key is active: it is removed once the
// latest judged time is two of its spans past the key's last event
// (counted as an idle eviction). A key's span is its window W, or for a
// bucket the time a full bucket takes to drain, B·W/L, when that is
// longer. Its references are empty by then (logs and fixed windows after
// one window; a bucket holding up to twice its capacity drains within two
// spans): only what an overshoot left beyond that is forgotten. The
// latest such expiry horizon (last event + span) is remembered as
// Forgotten: an event of a key without state older than it is late, since
// an expired state might have mattered to it. Besides, Config.MaxKeys
// bounds the keys and Config.MaxLogEntries the log entries of all keys
// together; past either, the least recently active key is evicted
// (counted; a key evicted while active is judged afresh if it returns,
// which undercounts its window). A key's logs hold at most W/Resolution
// entries each; the bucket and fixed-window references are a few words
// whatever the traffic, and hold no log entries. The buffer is bounded
// by MaxBuffered, the lists of wrong keys by MaxWrongKeys each (past it, the
// less severe half is dropped and the distinct counts become upper bounds),
// and rule and edge label values by MaxRules and MaxEdges (past them, events
// are tallied under "_other"; their keys stay distinct). A rule name that
// is not UTF-8 is reported with U+FFFD for its invalid bytes.
//
// # What it does not do
//
// It deduplicates only within Config.Dedup events (off by default), and
// only events not marked Framed (whose frames the consumer deduplicates):
// an exact copy of a recent event (a batch a producer wrote twice, or the
// consumer read again after a commit was cut off) is dropped and counted, but an
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
