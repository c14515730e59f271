// Package slots limits requests in flight per key across the PoP (rules
// of kind concurrency) over the same shared Store as the rate limiter:
// a slot is a counter in the epoch of the rule's lease, carried into each
// new epoch by the edges that still hold it, so that the slots of an edge
// that died vanish within one to two leases. See Slots.
//
// It imports packages store and algo, not the limiter.
package slots
