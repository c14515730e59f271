// Package envoy holds no code. Its directory holds an Envoy configuration
// (envoy.yaml) that asks poplimit's rate limit service, the
// envoyproxy/ratelimit file it is answered from (ratelimit/config.yaml),
// and README.md, which says how to run them together. Its tests decode
// envoy.yaml strictly into Envoy's API (go-control-plane's types, with
// their validation rules), load the ratelimit file as an edge does, and
// send the descriptors Envoy builds from envoy.yaml's actions to a real
// edge's service, checking the answers the README promises.
package envoy
