// Package event defines the rate-limit decision event: the Event type, its
// result (Allowed or Limited) and its canonical binary encoding (Append,
// Decode, EncodedLen). The rule's mode, action and algorithm are package
// policy's types, numbered on the wire as policy numbers them. An edge builds one Event per
// decision it reports, the pipeline carries it, the judge and the global
// tally read it. It imports only the standard library and package policy
// (itself a leaf of the standard library), so that a package
// that needs the type (the decision core, the judge) does not pull in a
// transport.
//
// An Event carries what the judge needs to rule on the decision alone:
// the time (Unix ns), the edge, the 64-bit key hash (client keys never
// leave the edge), the rule's name, algorithm, limit, window and burst,
// the action, the cost, the estimate the edge decided on, the decision and
// mode, whether the block cache, a shadow rule, the failure policy or
// a leaky-bucket queue (with its delay) decided it, and, for a rule that
// counts by response, the units the response counted and when the
// request settled. Append and Decode are
// canonical (decoding and re-encoding reproduces the input); they refuse
// what they do not understand with an error, never a panic, allocate
// nothing, and bound an event at MaxLen bytes. FORMAT.md, beside this file,
// gives the byte layout of every version. Package pipeline frames events
// for Kafka (its FORMAT.md gives the frame layout).
package event
