// Package proxies holds no code. Its directory holds configurations of the
// proxies people run in front of poplimit, each ready to copy, and the tests
// that run them for real:
//
//   - caddy/Caddyfile: Caddy's forward_auth asking poplimit in decision
//     mode;
//   - nginx/poplimit.conf.template: nginx's auth_request asking poplimit in
//     decision mode, with the idiom that turns its 429 into the client's;
//   - haproxy/haproxy.cfg: HAProxy in front of poplimit in proxy mode, with
//     option forwardfor.
//
// The tests build cmd/edge once per test binary, start an origin (a
// net/http server that echoes what it received), the edge and the real
// proxy (/usr/bin/caddy, /usr/sbin/nginx, /usr/sbin/haproxy) on loopback
// ports they pick, each with its own temporary directories, and check what
// a client sees: allowed requests at the origin with their quota fields,
// refusals as poplimit writes them, limits that follow the real client
// behind the proxy, and what happens when poplimit is down. Clients are
// told apart by their loopback source addresses (127.0.0.2, 127.0.0.3). A
// missing proxy skips its tests with the Debian package to install.
// README.md compares the proxies' failure behaviour with poplimit's rules.
package proxies
