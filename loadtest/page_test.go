package loadtest

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// synthResults are n requests over d from 2,000 clients (a few heavy),
// decided by three rules as an edge would answer them: what a Timeline is
// fed during a replay.
func synthResults(n int, d time.Duration, start time.Time) []Result {
	rng := rand.New(rand.NewPCG(1, 2))
	type rule struct {
		name          string
		limit, window int64
	}
	rules := []rule{{"abuse-block", 300, 10}, {"login", 5, 60}, {"per-client", 100, 10}}
	counts := map[[2]int64]int64{} // (rule, client, window index) → admitted, fixed windows
	out := make([]Result, 0, n)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(int64(d) * int64(i) / int64(n)))
		c := int64(rng.IntN(2000))
		if rng.IntN(10) == 0 {
			c = int64(rng.IntN(5)) // heavy hitters
		}
		rl := rules[2]
		if c < 5 {
			rl = rules[0]
		} else if rng.IntN(50) == 0 {
			rl = rules[1]
		}
		k := [2]int64{c<<8 | int64(len(rl.name)), at.Unix() / rl.window}
		status := 200
		if counts[k] >= rl.limit {
			status = 429
		} else {
			counts[k]++
		}
		r := Result{Index: int64(i), Scheduled: at, Sent: at.Add(200 * time.Microsecond), Done: at.Add(time.Duration(300+rng.IntN(5000)) * time.Microsecond),
			Status: status, Rule: rl.name, Client: netip.AddrFrom4([4]byte{10, 0, byte(c >> 8), byte(c)}),
			Quota: ResponseQuota{Limit: rl.limit, Remaining: 0, ResetSeconds: 1, WindowSeconds: rl.window, RetryAfter: -1}}
		if i%5000 == 0 {
			r.Err, r.Status = resultErr(0), 0
		}
		out = append(out, r)
	}
	return out
}

// A 60 s replay of 100,000 requests: the page stays under 2 MB whatever
// the run, and the time to write it is logged (the figure in
// docs/CONFIGURATION.md; not asserted, the machine is shared).
func TestPageBound(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	res := synthResults(100_000, time.Minute, start)
	tr := NewTimelineRecorder(start)
	for i := range res {
		tr.Add(&res[i])
	}
	rep := &ReplayReport{Targets: []string{"127.0.0.1:7070", "127.0.0.1:7072"}, Spread: "by-client", Speed: 1, Start: start,
		Scheduled: int64(len(res)), Statuses: map[string]int64{}, Stopped: StopEnd, ElapsedSeconds: 60}
	t0 := time.Now()
	tl := tr.Timeline()
	var b bytes.Buffer
	if err := WritePage(&b, rep, tl); err != nil {
		t.Fatal(err)
	}
	el := time.Since(t0)
	t.Logf("100,000 requests over 60 s: the page is %d bytes, written in %v (timeline %d steps of %gs, %d rules)",
		b.Len(), el, len(tl.Steps), tl.StepSeconds, len(tl.Rules))
	if b.Len() > 2<<20 {
		t.Errorf("the page is %d bytes, over 2 MB", b.Len())
	}
	if len(tl.Steps) != 60 || tl.StepSeconds != 1 {
		t.Errorf("%d steps of %g s, want 60 of 1", len(tl.Steps), tl.StepSeconds)
	}
	var allowed, limited, errs int64
	for _, s := range tl.Steps {
		allowed, limited, errs = allowed+s.Allowed, limited+s.Limited, errs+s.Errors
	}
	if allowed+limited+errs != 100_000 || errs != 20 {
		t.Errorf("steps hold %d allowed, %d limited, %d errors; want 100,000 with 20 errors", allowed, limited, errs)
	}
	for _, rt := range tl.Rules {
		if len(rt.Keys) == 0 || len(rt.Keys) > TimelineKeys {
			t.Errorf("rule %s: %d keys", rt.Rule, len(rt.Keys))
		}
		for _, k := range rt.Keys {
			if len(k.T) > timelinePoints || k.MaxInWindow > 2*rt.Limit || k.MaxInWindow < 1 {
				t.Errorf("rule %s key %s: %d points, most %d in a window of limit %d", rt.Rule, k.Key, len(k.T), k.MaxInWindow, rt.Limit)
			}
		}
	}
	// A fixed window admits up to twice its limit across a window edge:
	// the per-client heavy hitters show it.
	for _, rt := range tl.Rules {
		if rt.Rule == "abuse-block" && rt.Keys[0].MaxInWindow <= rt.Limit {
			t.Errorf("abuse-block's worst key: %d in a trailing window, want above the limit %d (fixed windows)", rt.Keys[0].MaxInWindow, rt.Limit)
		}
	}
}

// The steps fold in pairs past MaxTimelineSteps, keeping every count; the
// admitted send times kept for the keys are bounded.
func TestTimelineBounds(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	tr := NewTimelineRecorder(start)
	for i := 0; i < 3*MaxTimelineSteps; i++ {
		at := start.Add(time.Duration(i) * time.Second)
		tr.Add(&Result{Scheduled: at, Sent: at, Done: at.Add(time.Millisecond), Status: 200, Rule: "r",
			Client: netip.AddrFrom4([4]byte{10, 0, 0, 1}), Quota: ResponseQuota{Limit: 10, WindowSeconds: 60}})
	}
	tl := tr.Timeline()
	var n int64
	for _, s := range tl.Steps {
		n += s.Allowed
	}
	if tl.StepSeconds != 4 || len(tl.Steps) != 450 || n != 3*MaxTimelineSteps {
		t.Errorf("%d steps of %g s holding %d requests; want 450 of 4 s holding %d", len(tl.Steps), tl.StepSeconds, n, 3*MaxTimelineSteps)
	}
	if k := tl.Rules[0].Keys[0]; k.MaxInWindow != 60 || k.Admitted != 3*MaxTimelineSteps {
		t.Errorf("key %+v: want 60 in a trailing minute, %d admitted", k.MaxInWindow, 3*MaxTimelineSteps)
	}
	tr.admits = MaxTimelineAdmits
	tr.Add(&Result{Scheduled: start, Sent: start, Done: start, Status: 200, Rule: "r", Client: netip.AddrFrom4([4]byte{10, 0, 0, 2})})
	if tl := tr.Timeline(); tl.Truncated != 1 {
		t.Errorf("past MaxTimelineAdmits: truncated %d, want 1", tl.Truncated)
	}
}
