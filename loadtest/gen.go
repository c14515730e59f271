package loadtest

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/poplimit/poplimit/internal/mix"

	"github.com/poplimit/poplimit/rules"
)

// Endpoint is where a generator's requests go. Zero fields take the
// generator's defaults.
type Endpoint struct {
	Method string // default GET (POST for Stuffing)
	Host   string // default none: the replay target's address
	Path   string // default "/" ("/login" for Stuffing)
}

func (e Endpoint) withDefaults(method, path string) Endpoint {
	if e.Method == "" {
		e.Method = method
	}
	if e.Path == "" {
		e.Path = path
	}
	return e
}

func (e Endpoint) request(at time.Duration, ip netip.Addr) TraceRequest {
	return TraceRequest{At: at, IP: ip, Method: e.Method, Host: e.Host, Path: e.Path}
}

func (e Endpoint) check(gen string) error {
	r := e.request(0, netip.IPv4Unspecified())
	if fe := checkRequest(&r); fe != nil {
		return fmt.Errorf("loadtest: %s: %s: %s", gen, fe.reason, fe.detail)
	}
	return nil
}

// newRand returns the generators' random source for seed: PCG, so a seed
// gives the same trace on every platform.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// hostBits returns the number of addresses bits p leaves free, at most 64.
func hostBits(p netip.Prefix) int { return min(p.Addr().BitLen()-p.Bits(), 64) }

// addrAt returns p's address plus off (off < 2^hostBits(p)).
func addrAt(p netip.Prefix, off uint64) netip.Addr {
	a := p.Masked().Addr()
	if a.Is4() {
		b := a.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		v += uint32(off)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	b := a.As16()
	var carry uint64
	lo := uint64(b[8])<<56 | uint64(b[9])<<48 | uint64(b[10])<<40 | uint64(b[11])<<32 |
		uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15])
	if lo+off < lo {
		carry = 1
	}
	lo += off
	for i := 15; i >= 8; i-- {
		b[i] = byte(lo)
		lo >>= 8
	}
	for i := 7; i >= 0 && carry > 0; i-- {
		b[i]++
		if b[i] != 0 {
			carry = 0
		}
	}
	return netip.AddrFrom16(b)
}

// permute maps i to a distinct offset below 2^bits for every distinct i
// below 2^bits: a bijection, so flooded keys never repeat.
func permute(i, seed uint64, bits int) uint64 {
	if bits >= 64 {
		return mix.Mix64(i + seed)
	}
	mask := uint64(1)<<bits - 1
	return (i*0x9e3779b97f4a7c15 + seed) & mask // odd multiplier: a bijection mod 2^bits
}

func checkRate(gen, field string, v float64) error {
	if !(v > 0) || math.IsInf(v, 0) || v > 1e7 {
		return fmt.Errorf("loadtest: %s: %s %v: must be above 0 and at most 10,000,000 per second", gen, field, v)
	}
	return nil
}

func checkDuration(gen string, d time.Duration) error {
	if d <= 0 || d > maxOffset {
		return fmt.Errorf("loadtest: %s: Duration %v: must be above 0 and at most 10 years", gen, d)
	}
	return nil
}

// ZipfConfig configures Zipf: many clients whose rates follow Zipf's law,
// the shape of real traffic (a few heavy clients, a long tail).
type ZipfConfig struct {
	Seed     uint64
	Clients  int           // default 1000; client k (from 0) sends ∝ 1/(k+1)^S
	S        float64       // Zipf exponent, above 1; default 1.1
	Rate     float64       // requests per second of all clients together; default 100
	Duration time.Duration // default 1m
	Prefix   netip.Prefix  // client addresses, client k at base+k+1; default 10.0.0.0/8
	Endpoint
}

// Zipf returns a trace of Poisson arrivals at Rate, each from a client drawn
// by Zipf's law. Memory is constant whatever the length.
func Zipf(cfg ZipfConfig) (Trace, error) {
	if cfg.Clients == 0 {
		cfg.Clients = 1000
	}
	if cfg.S == 0 {
		cfg.S = 1.1
	}
	if cfg.Rate == 0 {
		cfg.Rate = 100
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Minute
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = netip.MustParsePrefix("10.0.0.0/8")
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("GET", "/")
	var errs []error
	if cfg.Clients < 1 || cfg.Clients > 1<<24 || uint64(cfg.Clients) >= uint64(1)<<hostBits(cfg.Prefix) {
		errs = append(errs, fmt.Errorf("loadtest: zipf: Clients %d: must be between 1 and 2^24 and fit in Prefix %v", cfg.Clients, cfg.Prefix))
	}
	if !(cfg.S > 1) || cfg.S > 10 {
		errs = append(errs, fmt.Errorf("loadtest: zipf: S %v: must be above 1 and at most 10", cfg.S))
	}
	errs = append(errs, checkRate("zipf", "Rate", cfg.Rate), checkDuration("zipf", cfg.Duration), cfg.Endpoint.check("zipf"))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed)
		var z *rand.Zipf
		if cfg.Clients > 1 {
			z = rand.NewZipf(rng, cfg.S, 1, uint64(cfg.Clients-1))
		}
		t := 0.0
		for {
			t += rng.ExpFloat64() / cfg.Rate
			at := time.Duration(t * 1e9)
			if at >= cfg.Duration {
				return
			}
			var k uint64
			if z != nil {
				k = z.Uint64()
			}
			if !yield(cfg.Endpoint.request(at, addrAt(cfg.Prefix, k+1)), nil) {
				return
			}
		}
	}, nil
}

// AbuserConfig configures Abuser: one client at a steady rate, typically
// above its limit.
type AbuserConfig struct {
	Seed     uint64
	IP       netip.Addr    // default 192.0.2.1
	Rate     float64       // requests per second; default 10
	Duration time.Duration // default 1m
	Start    time.Duration // offset of the first request; default 0
	// Jitter moves each request by up to ±Jitter/2 of the spacing, keeping
	// the order; 0 (default) is a metronome, at most 0.9.
	Jitter float64
	Endpoint
}

// Abuser returns a trace of one client sending every 1/Rate seconds:
// ⌈Rate × Duration⌉ requests.
func Abuser(cfg AbuserConfig) (Trace, error) {
	if !cfg.IP.IsValid() {
		cfg.IP = netip.MustParseAddr("192.0.2.1")
	}
	if cfg.Rate == 0 {
		cfg.Rate = 10
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Minute
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("GET", "/")
	errs := []error{checkRate("abuser", "Rate", cfg.Rate), checkDuration("abuser", cfg.Duration), cfg.Endpoint.check("abuser")}
	if cfg.Jitter < 0 || cfg.Jitter > 0.9 {
		errs = append(errs, fmt.Errorf("loadtest: abuser: Jitter %v: must be between 0 and 0.9", cfg.Jitter))
	}
	if cfg.Start < 0 || cfg.Start > maxOffset {
		errs = append(errs, fmt.Errorf("loadtest: abuser: Start %v: must be between 0 and 10 years", cfg.Start))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ip := cfg.IP.Unmap()
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed)
		spacing := 1e9 / cfg.Rate
		for i := 0; ; i++ {
			off := float64(i) * spacing
			if off >= float64(cfg.Duration) {
				return
			}
			if cfg.Jitter > 0 {
				off += (rng.Float64() - 0.5) * cfg.Jitter * spacing
			}
			at := cfg.Start + time.Duration(max(off, 0))
			if !yield(cfg.Endpoint.request(at, ip), nil) {
				return
			}
		}
	}, nil
}

// BurstConfig configures Burst: the boundary double-burst of a fixed window
// (the fixed window's 2× problem): Limit requests just before a window edge and
// Limit more just after it. A fixed-window counter admits all 2×Limit; a
// sliding window admits about Limit.
type BurstConfig struct {
	IP     netip.Addr    // default 198.51.100.1
	Limit  int           // requests in each half; default 100
	Window time.Duration // the rule's window; default 1m
	// Spread is how long each half lasts: the first half ends at the edge,
	// the second begins there. Default Window/100, at most Window/2.
	Spread time.Duration
	Bursts int // double bursts, three windows apart; default 1
	Endpoint
}

// Burst returns a trace of Bursts double bursts around the window edges at
// offsets (1+3b)×Window, b = 0, 1, …. Replay it with ReplayConfig.Align a
// multiple of Window, so that those offsets are the edges of the limiter's
// windows (which start at multiples of Window since the Unix epoch).
func Burst(cfg BurstConfig) (Trace, error) {
	if !cfg.IP.IsValid() {
		cfg.IP = netip.MustParseAddr("198.51.100.1")
	}
	if cfg.Limit == 0 {
		cfg.Limit = 100
	}
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if cfg.Spread == 0 {
		cfg.Spread = cfg.Window / 100
	}
	if cfg.Bursts == 0 {
		cfg.Bursts = 1
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("GET", "/")
	var errs []error
	if cfg.Limit < 1 || cfg.Limit > 1_000_000 {
		errs = append(errs, fmt.Errorf("loadtest: burst: Limit %d: must be between 1 and 1,000,000", cfg.Limit))
	}
	if cfg.Window <= 0 || cfg.Window > 24*time.Hour {
		errs = append(errs, fmt.Errorf("loadtest: burst: Window %v: must be above 0 and at most 24h", cfg.Window))
	}
	if cfg.Spread <= 0 || cfg.Spread > cfg.Window/2 {
		errs = append(errs, fmt.Errorf("loadtest: burst: Spread %v: must be above 0 and at most Window/2", cfg.Spread))
	}
	if cfg.Bursts < 1 || cfg.Bursts > 10_000 {
		errs = append(errs, fmt.Errorf("loadtest: burst: Bursts %d: must be between 1 and 10,000", cfg.Bursts))
	}
	errs = append(errs, cfg.Endpoint.check("burst"))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ip := cfg.IP.Unmap()
	return func(yield func(TraceRequest, error) bool) {
		step := cfg.Spread / time.Duration(cfg.Limit)
		for b := 0; b < cfg.Bursts; b++ {
			edge := time.Duration(1+3*b) * cfg.Window
			for i := 0; i < 2*cfg.Limit; i++ {
				at := edge - cfg.Spread + time.Duration(i)*step
				if i >= cfg.Limit {
					at = edge + time.Duration(i-cfg.Limit)*step
				}
				if !yield(cfg.Endpoint.request(at, ip), nil) {
					return
				}
			}
		}
	}, nil
}

// FloodConfig configures Flood: every request from a client never seen
// before, to test that the edge's memory stays bounded.
type FloodConfig struct {
	Seed     uint64
	Rate     float64       // requests per second; default 1000
	Duration time.Duration // default 1m
	Prefix   netip.Prefix  // addresses drawn without repeat; default 2001:db8::/32
	Endpoint
}

// Flood returns a trace of Poisson arrivals at Rate, each from a new client
// address: addresses are a bijection of the request number, so none repeats.
func Flood(cfg FloodConfig) (Trace, error) {
	if cfg.Rate == 0 {
		cfg.Rate = 1000
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Minute
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = netip.MustParsePrefix("2001:db8::/32")
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("GET", "/")
	errs := []error{checkRate("flood", "Rate", cfg.Rate), checkDuration("flood", cfg.Duration), cfg.Endpoint.check("flood")}
	bits := hostBits(cfg.Prefix)
	if want := cfg.Rate * cfg.Duration.Seconds() * 2; bits < 64 && want > float64(uint64(1)<<bits) {
		errs = append(errs, fmt.Errorf("loadtest: flood: Prefix %v: %d addresses are too few for Rate × Duration (want twice %v)", cfg.Prefix, uint64(1)<<bits, want/2))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed)
		t := 0.0
		for i := uint64(0); bits >= 64 || i < uint64(1)<<bits; i++ {
			t += rng.ExpFloat64() / cfg.Rate
			at := time.Duration(t * 1e9)
			if at >= cfg.Duration {
				return
			}
			if !yield(cfg.Endpoint.request(at, addrAt(cfg.Prefix, permute(i, cfg.Seed, bits))), nil) {
				return
			}
		}
	}, nil
}

// StuffingConfig configures Stuffing: credential stuffing, many addresses
// (a botnet, residential proxies) each trying a few passwords on one login
// path, each staying under any per-address limit.
type StuffingConfig struct {
	Seed     uint64
	IPs      int           // distinct addresses; default 1000
	Attempts int           // attempts per address; default 3
	Rate     float64       // new addresses per second; default 20
	Gap      time.Duration // mean time between one address's attempts (±50%); default 5s
	Prefix   netip.Prefix  // addresses drawn without repeat; default 100.64.0.0/10
	// UserHeader, when set, carries a distinct user name on every attempt
	// (e.g. "X-Login-User"), for rules keyed on the account.
	UserHeader string
	Endpoint   // default POST /login

	// Accounts, when set, is how many accounts the addresses attack
	// together: each attempt names one of them, drawn at random
	// (StuffingVictim), with a wrong password, so every account is
	// tried many times, each time from another address. Default 0: a
	// fresh user name per attempt (in UserHeader).
	Accounts int
	// Body, when set, puts the account and the password in the request
	// body: "form" (application/x-www-form-urlencoded: username=, password=)
	// or "json" (application/json: {"user":{"email":…},"password":…}).
	// Default "": no body.
	Body string
	// HonestUsers, when set, adds that many honest users, each on an
	// address of its own (in 198.18.0.0/15) logging in to its own account
	// (StuffingMember) with its password (StuffingPassword) at HonestRate
	// logins a second, all of them together, for as long as the attack
	// lasts (HonestDuration). An honest login is mistyped with probability
	// Mistype: a wrong password, retried 1 to 3 s later (mistyped again
	// with the same probability). Honest users sometimes type their name
	// in other letter cases. Default 0: none.
	HonestUsers int
	// HonestRate is the honest users' logins per second, all together.
	// Default 2.
	HonestRate float64
	// Mistype is the probability that an honest attempt has a wrong
	// password, 0 to 0.9. Default 0.1.
	Mistype float64
	// HonestDuration is how long honest users log in. Default IPs / Rate
	// + Attempts × Gap: about the attack's span.
	HonestDuration time.Duration
}

// StuffingPassword is the right password of account user in a Stuffing
// trace: an origin that stands in for a login service accepts it, and
// refuses every other (attackers never send it).
func StuffingPassword(user string) string {
	return "pw-" + strings.ToLower(user) + "-ok"
}

// StuffingVictim returns the name of the attacked account i (from 0) of a
// Stuffing trace with Accounts set.
func StuffingVictim(i int) string { return fmt.Sprintf("victim%05d@example.com", i) }

// StuffingMember returns the name of honest user i's account (from 0).
func StuffingMember(i int) string { return fmt.Sprintf("member%05d@example.com", i) }

// loginBody returns the body and content type of a login attempt.
func loginBody(format, user, password string) (body, contentType string) {
	switch format {
	case "form":
		return "username=" + url.QueryEscape(user) + "&password=" + url.QueryEscape(password),
			"application/x-www-form-urlencoded"
	case "json":
		b, _ := json.Marshal(struct {
			User struct {
				Email string `json:"email"`
			} `json:"user"`
			Password string `json:"password"`
		}{User: struct {
			Email string `json:"email"`
		}{user}, Password: password})
		return string(b), "application/json"
	}
	return "", ""
}

// Stuffing returns a credential-stuffing trace. It holds the addresses
// between their attempts: about Rate × Attempts × Gap of them.
func Stuffing(cfg StuffingConfig) (Trace, error) {
	if cfg.IPs == 0 {
		cfg.IPs = 1000
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = 3
	}
	if cfg.Rate == 0 {
		cfg.Rate = 20
	}
	if cfg.Gap == 0 {
		cfg.Gap = 5 * time.Second
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = netip.MustParsePrefix("100.64.0.0/10")
	}
	cfg.Endpoint = cfg.Endpoint.withDefaults("POST", "/login")
	errs := []error{checkRate("stuffing", "Rate", cfg.Rate), cfg.Endpoint.check("stuffing")}
	if cfg.IPs < 1 || cfg.IPs > 1<<24 || uint64(cfg.IPs) >= uint64(1)<<hostBits(cfg.Prefix) {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: IPs %d: must be between 1 and 2^24 and fit in Prefix %v", cfg.IPs, cfg.Prefix))
	}
	if cfg.Attempts < 1 || cfg.Attempts > 1000 {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: Attempts %d: must be between 1 and 1000", cfg.Attempts))
	}
	if cfg.Gap <= 0 || cfg.Gap > 24*time.Hour {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: Gap %v: must be above 0 and at most 24h", cfg.Gap))
	}
	if cfg.UserHeader != "" && (!rules.IsToken(cfg.UserHeader) || replayerHeader(cfg.UserHeader)) {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: UserHeader %q: not a header name the trace may set", cfg.UserHeader))
	}
	if cfg.HonestRate == 0 {
		cfg.HonestRate = 2
	}
	if cfg.Mistype == 0 {
		cfg.Mistype = 0.1
	}
	if cfg.HonestDuration == 0 {
		cfg.HonestDuration = time.Duration(float64(cfg.IPs)/cfg.Rate*1e9) + time.Duration(cfg.Attempts)*cfg.Gap
	}
	if cfg.Accounts < 0 || cfg.Accounts > 1<<20 {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: Accounts %d: must be between 0 (a fresh user per attempt) and 2^20", cfg.Accounts))
	}
	if cfg.Body != "" && cfg.Body != "form" && cfg.Body != "json" {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: Body %q: want form, json or empty (no body)", cfg.Body))
	}
	if cfg.HonestUsers < 0 || cfg.HonestUsers > 1<<17 {
		errs = append(errs, fmt.Errorf("loadtest: stuffing: HonestUsers %d: must be between 0 and 2^17 (198.18.0.0/15)", cfg.HonestUsers))
	}
	if cfg.HonestUsers > 0 {
		errs = append(errs, checkRate("stuffing", "HonestRate", cfg.HonestRate))
		if cfg.Mistype < 0 || cfg.Mistype > 0.9 {
			errs = append(errs, fmt.Errorf("loadtest: stuffing: Mistype %v: must be between 0 and 0.9", cfg.Mistype))
		}
		if cfg.HonestDuration < 0 || cfg.HonestDuration > maxOffset {
			errs = append(errs, fmt.Errorf("loadtest: stuffing: HonestDuration %v: must be between 0 and 10 years", cfg.HonestDuration))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	attack := stuffingAttack(cfg)
	if cfg.HonestUsers == 0 {
		return attack, nil
	}
	return Mix(attack, honestLogins(cfg)), nil
}

// honestPrefix holds the honest users' addresses.
var honestPrefix = netip.MustParsePrefix("198.18.0.0/15")

// login returns a login attempt of user with password at at from ip.
func (cfg *StuffingConfig) login(at time.Duration, ip netip.Addr, user, password string) TraceRequest {
	r := cfg.Endpoint.request(at, ip)
	if cfg.UserHeader != "" {
		r.Headers = map[string]string{cfg.UserHeader: user}
	}
	r.Body, r.ContentType = loginBody(cfg.Body, user, password)
	return r
}

// honestLogins returns the honest users' logins of a Stuffing trace, in
// time order.
func honestLogins(cfg StuffingConfig) Trace {
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed ^ 0x5bd1e995)
		var retries attemptHeap // an attempt's user is its left field
		next := 0.0
		for {
			next += rng.ExpFloat64() / cfg.HonestRate
			arrival := time.Duration(next * 1e9)
			if arrival >= cfg.HonestDuration {
				arrival = time.Duration(math.MaxInt64)
			}
			for retries.Len() > 0 && retries[0].at <= arrival {
				a := heap.Pop(&retries).(attempt)
				if !cfg.honestAttempt(rng, &retries, a.at, a.left, yield) {
					return
				}
			}
			if arrival == time.Duration(math.MaxInt64) {
				return
			}
			if !cfg.honestAttempt(rng, &retries, arrival, rng.IntN(cfg.HonestUsers), yield) {
				return
			}
		}
	}
}

// honestAttempt yields honest user i's attempt at at: mistyped with
// probability Mistype, and then retried 1 to 3 s later.
func (cfg *StuffingConfig) honestAttempt(rng *rand.Rand, retries *attemptHeap, at time.Duration, i int,
	yield func(TraceRequest, error) bool) bool {
	user := StuffingMember(i)
	typed := user
	if rng.IntN(4) == 0 { // the same account in other letter cases
		typed = strings.ToUpper(user[:1]) + user[1:]
		if rng.IntN(2) == 0 {
			typed = strings.ToUpper(user)
		}
	}
	password := StuffingPassword(user)
	if rng.Float64() < cfg.Mistype {
		password = password[:len(password)-2] + "0k" // one key off
		heap.Push(retries, attempt{at: at + time.Second + time.Duration(rng.Float64()*2e9), left: i})
	}
	return yield(cfg.login(at, addrAt(honestPrefix, uint64(i)+1), typed, password), nil)
}

// stuffingAttack returns the attackers' attempts of a Stuffing trace.
func stuffingAttack(cfg StuffingConfig) Trace {
	bits := hostBits(cfg.Prefix)
	return func(yield func(TraceRequest, error) bool) {
		rng := newRand(cfg.Seed)
		var pending attemptHeap
		next := 0.0 // next new address, seconds
		started := 0
		for started < cfg.IPs || pending.Len() > 0 {
			arrival := time.Duration(math.MaxInt64)
			if started < cfg.IPs {
				next += rng.ExpFloat64() / cfg.Rate
				arrival = time.Duration(next * 1e9)
			}
			for pending.Len() > 0 && pending[0].at <= arrival {
				a := pending[0]
				var r TraceRequest
				switch {
				case cfg.Accounts > 0:
					victim := StuffingVictim(rng.IntN(cfg.Accounts))
					r = cfg.login(a.at, a.ip, victim, fmt.Sprintf("guess%08x", rng.Uint32()))
				case cfg.UserHeader != "" || cfg.Body != "":
					user, guess := fmt.Sprintf("user%07d", rng.IntN(10_000_000)), ""
					if cfg.Body != "" {
						guess = fmt.Sprintf("guess%08x", rng.Uint32())
					}
					r = cfg.login(a.at, a.ip, user, guess)
				default:
					r = cfg.Endpoint.request(a.at, a.ip)
				}
				if a.left--; a.left > 0 {
					pending[0].at += time.Duration((0.5 + rng.Float64()) * float64(cfg.Gap))
					pending[0].left = a.left
					heap.Fix(&pending, 0)
				} else {
					heap.Pop(&pending)
				}
				if !yield(r, nil) {
					return
				}
			}
			if started < cfg.IPs {
				ip := addrAt(cfg.Prefix, permute(uint64(started), cfg.Seed, bits))
				heap.Push(&pending, attempt{at: arrival, ip: ip, left: cfg.Attempts})
				started++
			}
		}
	}
}

type attempt struct {
	at   time.Duration
	ip   netip.Addr
	left int
}

type attemptHeap []attempt

func (h attemptHeap) Len() int           { return len(h) }
func (h attemptHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h attemptHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *attemptHeap) Push(x any)        { *h = append(*h, x.(attempt)) }
func (h *attemptHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Mix merges traces into one in time order (ties go to the earlier trace).
// Each range over the mix ranges over every part once, concurrently with
// none: the parts are pulled one request at a time.
func Mix(parts ...Trace) Trace {
	return func(yield func(TraceRequest, error) bool) {
		type head struct {
			next func() (TraceRequest, error, bool)
			r    TraceRequest
		}
		heads := make([]*head, 0, len(parts))
		for _, p := range parts {
			next, stop := iter.Pull2(iter.Seq2[TraceRequest, error](p))
			defer stop()
			heads = append(heads, &head{next: next})
		}
		// fill advances h to its next request; false when h is done.
		fill := func(h *head) (bool, error) {
			r, err, ok := h.next()
			if ok && err == nil {
				h.r = r
			}
			return ok, err
		}
		live := heads[:0]
		for _, h := range heads {
			for {
				ok, err := fill(h)
				if err != nil {
					if !yield(TraceRequest{}, err) || !isLineError(err) {
						return
					}
					continue
				}
				if ok {
					live = append(live, h)
				}
				break
			}
		}
		for len(live) > 0 {
			best := 0
			for i, h := range live {
				if h.r.At < live[best].r.At {
					best = i
				}
			}
			h := live[best]
			if !yield(h.r, nil) {
				return
			}
			for {
				ok, err := fill(h)
				if err != nil {
					if !yield(TraceRequest{}, err) || !isLineError(err) {
						return
					}
					continue
				}
				if !ok {
					live = append(live[:best], live[best+1:]...)
				}
				break
			}
		}
	}
}

func isLineError(err error) bool {
	var le *LineError
	return errors.As(err, &le)
}
