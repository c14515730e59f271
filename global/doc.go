// Package global holds a rule's limit across PoPs (rules of scope global).
//
// Within a PoP the edges share their counts through the PoP's store. Across
// PoPs they share nothing on the request path: the aggregator, which
// consumes every PoP's decision events, counts the units each PoP counted
// for each key of a global rule (Tally), and publishes those counts at an
// interval to a Kafka topic (Publisher); every edge reads the topic (Feed)
// into a Table, and decides a global rule's key against its limit less
// what the other PoPs counted in the trailing window (Table.Others). A
// block therefore propagates with the counts: a key at its limit in one
// PoP leaves no room in the others within about one interval.
//
// Only keys whose counts matter travel: a key is published while its units
// across PoPs in its current and previous windows reach MinShare of its
// limit; below that, every PoP's own count keeps the key under its limit.
// The Tally and the Table are bounded (MaxKeys), and each message carries
// one key.
//
// Every message names its publisher and carries its clock; with a key
// shared by the aggregators and the edges (KafkaConfig.Key, LoadKey) it is
// signed with HMAC-SHA256 and a Feed drops what the key did not sign. A
// Table checks each message against the edge's clock (TableConfig.Now):
// stamped in the future or longer ago than Stale, stamped before its
// publisher's previous message, counts of a window in the future or that
// no longer weighs: dropped, and counted by reason. It expires entries by
// that clock too, whether messages come or not (Sweep).
//
// An edge whose Table has not heard each publisher's heartbeat within
// Stale, or has not yet read a whole publish of each, is cut off (the
// topic, the broker or an aggregator is out of reach): it then holds a
// global rule's keys to Share of their limits, counted in
// poplimit_edge_global_fallbacks_total. A publisher that stops cleanly
// says so (a farewell); one that dies is waited for Forget. A Table that
// had to refuse a key for want of room holds the keys it does not hold
// the same way, for Stale after the refusal.
//
// The wire format of the topic's messages is in FORMAT.md beside this
// file.
package global
