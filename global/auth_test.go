package global

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// A table tracks publishers: fresh once it read two heartbeats of each,
// while each beat within Stale; a replay, a stale or future stamp changes
// nothing; a restart replaces the old instance; a farewell removes it; a
// publisher unheard for Forget is forgotten.
func TestTablePublishers(t *testing.T) {
	now := 1_800_000_000 * sec
	clock := now
	tb := NewTable(TableConfig{Pop: "a", Stale: 2 * time.Second, Now: func() int64 { return clock }})
	take := func(kind byte, h Header, at int64) Drop {
		t.Helper()
		var b []byte
		switch kind {
		case kindHeartbeat:
			b = AppendHeartbeat(nil, &h, 100*time.Millisecond)
		case kindFarewell:
			b = AppendFarewell(nil, &h)
		}
		var m decoded
		if err := decode(b, &m); err != nil {
			t.Fatal(err)
		}
		return tb.take(&m, at)
	}
	p1 := Header{Publisher: "p1", Instance: 1}
	p2 := Header{Publisher: "p2", Instance: 1}
	at := func(h Header, s int64) Header { h.Stamp = s; return h }
	if d := take(kindHeartbeat, at(p1, 0), now); d != DropStale {
		t.Errorf("a heartbeat stamped 0: %v, want stale", d)
	}
	if d := take(kindHeartbeat, at(p1, now+2*sec), now); d != DropFuture {
		t.Errorf("a heartbeat stamped 2 s ahead: %v, want future", d)
	}
	take(kindHeartbeat, at(p1, now), now)
	take(kindHeartbeat, at(p2, now), now)
	if tb.Fresh(now) {
		t.Error("fresh after one heartbeat of each")
	}
	now += sec / 10
	take(kindHeartbeat, at(p1, now), now)
	if tb.Fresh(now) {
		t.Error("fresh with p2's whole publish not read")
	}
	take(kindHeartbeat, at(p2, now), now)
	if !tb.Fresh(now) {
		t.Error("not fresh after two heartbeats of each")
	}
	if d := take(kindHeartbeat, at(p1, now-sec/10), now); d != DropReplay {
		t.Errorf("p1's older heartbeat again: %v, want replay", d)
	}
	// p2 dies; p1 beats on. Stale 2 s after p2's last beat.
	for range 25 {
		now += sec / 10
		take(kindHeartbeat, at(p1, now), now)
	}
	if tb.Fresh(now) {
		t.Error("fresh 2.5 s after p2's last heartbeat")
	}
	// Forgotten after 15 × Stale.
	for now < 1_800_000_000*sec+31*sec {
		now += sec / 10
		take(kindHeartbeat, at(p1, now), now)
		tb.Sweep(now)
	}
	if !tb.Fresh(now) || tb.Publishers() != 1 {
		t.Errorf("31 s after p2 died: fresh %v, %d publishers; want fresh, 1", tb.Fresh(now), tb.Publishers())
	}
	// p1 restarts (a new instance, later stamps): not fresh until two of
	// its heartbeats; an older instance's message is then a replay.
	take(kindHeartbeat, at(Header{Publisher: "p1", Instance: 2}, now+1), now)
	if tb.Fresh(now) {
		t.Error("fresh right after p1 restarted")
	}
	if d := take(kindHeartbeat, at(p1, now), now); d != DropReplay {
		t.Errorf("the old instance after the new: %v, want replay", d)
	}
	take(kindFarewell, at(Header{Publisher: "p1", Instance: 2}, now+2), now)
	if tb.Publishers() != 0 || tb.Fresh(now) {
		t.Errorf("after p1's farewell: %d publishers, fresh %v; want 0, not fresh", tb.Publishers(), tb.Fresh(now))
	}
}

// Counts of a window that no longer weighs, or that starts in the future,
// are dropped; entries leave by the edge's clock; a full table holds a key
// it does not hold as not fresh, without allocating.
func TestTableCountsByTheEdgesClock(t *testing.T) {
	now := 1_800_000_000 * sec
	tb := NewTable(TableConfig{Pop: "a", MaxKeys: 2})
	h := Header{Publisher: "p", Instance: 1, Stamp: now}
	counts := func(key uint64, start int64) Drop {
		var m decoded
		c := Counts{Key: key, Start: start / 1e6, WindowMs: 10_000, Pops: []PopCount{{Pop: "b", Units: [2 * Slots]uint64{Slots: 5}}}}
		if err := decode(AppendCounts(nil, &h, &c), &m); err != nil {
			t.Fatal(err)
		}
		return tb.take(&m, now)
	}
	beat(t, tb, h, now-sec/10)
	beat(t, tb, h, now)
	if d := counts(1, now+2*sec); d != DropFuture {
		t.Errorf("counts of a window starting 2 s ahead: %v, want future", d)
	}
	if d := counts(1, now-20*sec); d != DropStale {
		t.Errorf("counts two windows old: %v, want stale", d)
	}
	win := windowStart(now, 10*sec)
	if counts(1, win) != Kept || counts(2, win) != Kept {
		t.Fatal("counts of this window not kept")
	}
	if got, fresh := tb.Others(3, now, 10*sec); got != 0 || !fresh {
		t.Errorf("a key not sent, the table not full yet: %d, %v; want 0, fresh", got, fresh)
	}
	if d := counts(3, win); d != DropTableFull {
		t.Errorf("a third key in a table of 2: %v, want table_full", d)
	}
	if _, fresh := tb.Others(3, now, 10*sec); fresh {
		t.Error("a key the full table refused: fresh")
	}
	if got, fresh := tb.Others(1, now, 10*sec); got != 5 || !fresh {
		t.Errorf("a key the table holds: %d, %v; want 5, fresh", got, fresh)
	}
	if n := testing.AllocsPerRun(100, func() { tb.Others(3, now, 10*sec) }); n != 0 {
		t.Errorf("Others of a key a full table refused: %v allocations, want 0", n)
	}
	if tb.HeldFull() == 0 {
		t.Error("HeldFull: 0")
	}
	// The windows pass by the edge's clock: swept with no message coming.
	for i := range tableShards {
		tb.Sweep(win + 20*sec + int64(i))
	}
	if n, _ := tb.Keys(); n != 0 {
		t.Errorf("two windows on, swept: %d keys, want 0", n)
	}
}

func TestSignAndVerify(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	h := Header{Publisher: "p", Instance: 1, Stamp: 5}
	v := AppendCounts(nil, &h, &Counts{Key: 9, Start: 1, WindowMs: 1000})
	kk := []byte{0, 0, 0, 0, 0, 0, 0, 9}
	s, err := Sign(key, DefaultTopic, kk, bytes.Clone(v))
	if err != nil {
		t.Fatal(err)
	}
	m := newMAC(key, DefaultTopic)
	if !m.verify(kk, s) {
		t.Fatal("a signed message does not verify")
	}
	var d decoded
	if err := decode(s, &d); err != nil || !d.signed || d.c.Key != 9 {
		t.Errorf("decode of a signed message: %+v, %v", d, err)
	}
	for name, bad := range map[string]func() ([]byte, []byte){
		"another topic": func() ([]byte, []byte) { s, _ := Sign(key, "other", kk, bytes.Clone(v)); return kk, s },
		"another key": func() ([]byte, []byte) {
			s, _ := Sign(bytes.Repeat([]byte{2}, 32), DefaultTopic, kk, bytes.Clone(v))
			return kk, s
		},
		"another Kafka key": func() ([]byte, []byte) {
			return []byte{1}, s
		},
		"a byte changed": func() ([]byte, []byte) { b := bytes.Clone(s); b[len(b)-MACSize-1] ^= 1; return kk, b },
		"unsigned":       func() ([]byte, []byte) { return kk, v },
	} {
		k, b := bad()
		if m.verify(k, b) {
			t.Errorf("%s: verifies", name)
		}
	}
	if _, err := Sign(key[:31], DefaultTopic, nil, bytes.Clone(v)); err == nil {
		t.Error("Sign with a key of 31 bytes: no error")
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k32 := strings.Repeat("k", 32)
	if k, err := LoadKey("-global-key-file", write("ok", k32+"\n")); err != nil || string(k) != k32 {
		t.Errorf("32 bytes and a newline: %q, %v", k, err)
	}
	for name, p := range map[string]string{
		"31 bytes":  write("short", k32[:31]+"\r\n"),
		"missing":   filepath.Join(dir, "missing"),
		"too large": write("large", strings.Repeat("k", 5000)),
	} {
		if _, err := LoadKey("-global-key-file", p); err == nil || !strings.Contains(err.Error(), "-global-key-file") {
			t.Errorf("%s: %v, want an error naming -global-key-file", name, err)
		}
	}
}

// FuzzDecode: decode never panics, and what it accepts re-encodes to the
// same bytes.
func FuzzDecode(f *testing.F) {
	h := Header{Publisher: "agg", Instance: 7, Stamp: 1e18}
	f.Add(AppendCounts(nil, &h, &Counts{Key: 1, Start: 2, WindowMs: 3, Pops: []PopCount{{Pop: "a", Units: [2 * Slots]uint64{1, 300}}}}))
	f.Add(AppendHeartbeat(nil, &h, time.Second))
	f.Add(AppendFarewell(nil, &h))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m decoded
		if decode(b, &m) != nil || m.signed {
			return
		}
		var again []byte
		switch m.kind {
		case kindCounts:
			again = AppendCounts(nil, &m.h, &m.c)
		case kindHeartbeat:
			again = AppendHeartbeat(nil, &m.h, time.Duration(m.interval))
		case kindFarewell:
			again = AppendFarewell(nil, &m.h)
		}
		var m2 decoded
		if err := decode(again, &m2); err != nil || m2.kind != m.kind || m2.h != m.h || m2.interval != m.interval || m2.c.Key != m.c.Key || len(m2.c.Pops) != len(m.c.Pops) {
			t.Fatalf("%x: decoded %+v, re-encoded %x, decoded %+v, %v", b, m, again, m2, err)
		}
	})
}

// BenchmarkFeedTake is what a Feed does with one message of one PoP's
// counts: check its MAC (signed) or not, decode it and apply it.
func BenchmarkFeedTake(b *testing.B) {
	for _, signed := range []bool{false, true} {
		name := "unsigned"
		if signed {
			name = "signed"
		}
		b.Run(name, func(b *testing.B) {
			key := bytes.Repeat([]byte{1}, 32)
			now := time.Now().UnixNano()
			tb := NewTable(TableConfig{Pop: "a", Now: func() int64 { return now }})
			f := &Feed{table: tb}
			if signed {
				f.mac = newMAC(key, DefaultTopic)
			}
			c := Counts{Key: 9, Start: windowStart(now, 10*sec) / 1e6, WindowMs: 10_000, Pops: []PopCount{{Pop: "b", Units: [2 * Slots]uint64{Slots: 5}}}}
			kk := []byte{0, 0, 0, 0, 0, 0, 0, 9}
			v := AppendCounts(nil, &Header{Publisher: "agg", Instance: 1, Stamp: now}, &c)
			if signed {
				v, _ = Sign(key, DefaultTopic, kk, v)
			}
			msg := kafka.Message{Key: kk, Value: v}
			var m decoded
			b.ReportAllocs()
			for b.Loop() {
				if d := f.take(&msg, &m); d != Kept {
					b.Fatal(d)
				}
			}
		})
	}
}
