package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/poplimit/poplimit/judge"
	"github.com/poplimit/poplimit/loadtest"
	"github.com/poplimit/poplimit/rules"
	"github.com/valyala/fasthttp"
)

// The demo's logins. Its origin stands in for a login service: POST
// /login answers 200 when the body's password is the account's
// (loadtest.StuffingPassword) and 401 otherwise; every other request
// "origin ok". The replay's credential stuffing attacks a set of accounts
// from many addresses, a few wrong passwords each, beside honest users
// who sometimes mistype; the rules that count failed logins (count:
// {status: [401]}) per account and per address stop the attackers and
// never the honest users, and the summary says so.

// originHandler is the demo origin.
func originHandler(c *fasthttp.RequestCtx) {
	if string(c.Path()) != "/login" || !c.IsPost() {
		c.WriteString("origin ok\n")
		return
	}
	user, password := loginCredentials(c.Request.Header.ContentType(), c.PostBody())
	if user == "" || password != loadtest.StuffingPassword(user) {
		c.SetStatusCode(fasthttp.StatusUnauthorized)
		c.WriteString("wrong user name or password\n")
		return
	}
	c.WriteString("welcome\n")
}

// loginCredentials reads a login body: a form's username and password, or
// JSON's user.email and password.
func loginCredentials(contentType, body []byte) (user, password string) {
	ct, _, _ := strings.Cut(string(contentType), ";")
	switch strings.ToLower(strings.TrimSpace(ct)) {
	case "application/x-www-form-urlencoded":
		q, err := url.ParseQuery(string(body))
		if err != nil || len(q["username"]) != 1 || len(q["password"]) != 1 {
			return "", ""
		}
		return q.Get("username"), q.Get("password")
	case "application/json":
		var b struct {
			User struct {
				Email string `json:"email"`
			} `json:"user"`
			Password string `json:"password"`
		}
		if json.Unmarshal(body, &b) != nil {
			return "", ""
		}
		return b.User.Email, b.Password
	}
	return "", ""
}

// loginAttempt is what the summary knows of one login the replay sent.
type loginAttempt struct {
	account string // lower case
	honest  bool
	right   bool // the right password
}

// loginTally follows the replay's logins: the trace records each login
// by its index among the requests due, the results say how each ended.
type loginTally struct {
	mu       sync.Mutex
	sent     map[int64]loginAttempt
	accounts map[string]*accountLogins
	next     int64 // index of the next request due
}

// accountLogins are one account's logins: attempts, those the origin
// answered (401 or 200), those the edges refused.
type accountLogins struct {
	honest                      bool
	attempts, answered, refused int
	failedAtOrigin              int // answered 401
}

func newLoginTally() *loginTally {
	return &loginTally{sent: map[int64]loginAttempt{}, accounts: map[string]*accountLogins{}}
}

// trace wraps tr, noting each login as it is due.
func (lt *loginTally) trace(tr loadtest.Trace) loadtest.Trace {
	return func(yield func(loadtest.TraceRequest, error) bool) {
		for r, err := range tr {
			if err == nil {
				if user, pw := loginCredentials([]byte(r.ContentType), []byte(r.Body)); user != "" {
					a := strings.ToLower(user)
					lt.mu.Lock()
					lt.sent[lt.next] = loginAttempt{account: a, honest: strings.HasPrefix(a, "member"),
						right: pw == loadtest.StuffingPassword(user)}
					lt.mu.Unlock()
				}
				lt.next += int64(max(r.Count, 1))
			}
			if !yield(r, err) {
				return
			}
		}
	}
}

// result takes one request's outcome (ReplayConfig.OnResult).
func (lt *loginTally) result(res loadtest.Result) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	la, ok := lt.sent[res.Index]
	if !ok {
		return
	}
	delete(lt.sent, res.Index)
	a := lt.accounts[la.account]
	if a == nil {
		a = &accountLogins{honest: la.honest}
		lt.accounts[la.account] = a
	}
	a.attempts++
	switch res.Status {
	case fasthttp.StatusOK:
		a.answered++
	case fasthttp.StatusUnauthorized:
		a.answered++
		a.failedAtOrigin++
	case 0: // not sent, or a transport error: neither answered nor refused
	default:
		a.refused++
	}
}

// countingRules returns the names of the rules of the rules file that
// count by response.
func countingRules(path string) map[string]bool {
	out := map[string]bool{}
	data, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	rs, err := rules.ParseRules(data)
	if err != nil {
		return out
	}
	for _, r := range rs.Rules {
		if r.Count.On() {
			out[r.Name] = true
		}
	}
	return out
}

// writeLogins writes the summary of the logins: the attackers' attempts
// and how many the failed-login rules stopped, per account; the honest
// users' and how many were refused (none, when the rules are right); and
// the judge's figures for the rules that count by response.
func writeLogins(w io.Writer, lt *loginTally, rep *loadtest.ReplayReport, counting map[string]bool, perAccountLimit int) error {
	var b bytes.Buffer
	lt.mu.Lock()
	var attacked, honest []string
	for name, a := range lt.accounts {
		if a.honest {
			honest = append(honest, name)
		} else {
			attacked = append(attacked, name)
		}
	}
	slices.Sort(attacked)
	var att, attAnswered, attRefused, worstFailed int
	worstAccount := ""
	for _, name := range attacked {
		a := lt.accounts[name]
		att, attAnswered, attRefused = att+a.attempts, attAnswered+a.answered, attRefused+a.refused
		if a.failedAtOrigin > worstFailed {
			worstFailed, worstAccount = a.failedAtOrigin, name
		}
	}
	var hon, honRefused, honFailed int
	for _, name := range honest {
		a := lt.accounts[name]
		hon, honRefused, honFailed = hon+a.attempts, honRefused+a.refused, honFailed+a.failedAtOrigin
	}
	lt.mu.Unlock()

	b.WriteString("pop: logins: credential stuffing against accounts, failed logins counted by the origin's answer (401)\n")
	if len(attacked) > 0 {
		fmt.Fprintf(&b, "  attackers: %d attempts on %d accounts: %d reached the origin, %d stopped by the edges (%s of them);\n",
			att, len(attacked), attAnswered, attRefused, percent(float64(attRefused)/float64(max(att, 1))))
		fmt.Fprintf(&b, "    per account at most %d wrong passwords reached the origin (%s)", worstFailed, worstAccount)
		if perAccountLimit > 0 {
			fmt.Fprintf(&b, ", the limit being %d per account in each PoP", perAccountLimit)
		}
		b.WriteString("\n")
		b.WriteString("    account                     attempts  reached origin  stopped\n")
		for i, name := range attacked {
			if i == 8 {
				fmt.Fprintf(&b, "    … and %d more accounts\n", len(attacked)-i)
				break
			}
			a := lt.accounts[name]
			fmt.Fprintf(&b, "    %-27s %8d %15d %8d\n", name, a.attempts, a.answered, a.refused)
		}
	}
	if len(honest) > 0 {
		verdict := "none refused"
		if honRefused > 0 {
			verdict = fmt.Sprintf("%d REFUSED", honRefused)
		}
		fmt.Fprintf(&b, "  honest users: %d logins by %d users, %d of them mistyped (401 from the origin): %s\n",
			hon, len(honest), honFailed, verdict)
	}
	var jr judge.Report
	if len(rep.Aggregator) > 0 && json.Unmarshal(rep.Aggregator, &jr) == nil {
		for _, r := range jr.ByRule {
			if !counting[r.Name] {
				continue
			}
			e := r.Enforced
			fmt.Fprintf(&b, "  judge, %s (counts by response): %d decisions, %s wrong (%d wrongly allowed, %d wrongly limited)\n",
				r.Name, e.Decisions, percent(e.WrongRatio), e.WronglyAllowed, e.WronglyLimited)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}
