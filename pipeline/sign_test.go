package pipeline_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/event/eventtest"
	"github.com/poplimit/poplimit/pipeline"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, pipeline.MinKeyLen) }

// TestFrameKey: a signed frame verifies with its key on its partition, and
// with no other key, on no other partition, and after no change of a
// byte; it decodes to the events an unsigned frame of them holds.
func TestFrameKey(t *testing.T) {
	evs := frameEvents(5)
	signed := pipeline.SealSignedFrame(t, testKey(1), 9, evs)
	if signed[0] != 0x80|pipeline.FrameVersionSigned {
		t.Fatalf("first byte: got %#x, want 0x82", signed[0])
	}
	k, err := pipeline.NewFrameKey(testKey(1))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := pipeline.NewFrameKey(testKey(2))
	if !k.Verify(signed, 0) {
		t.Fatal("Verify on its key and partition: got false, want true")
	}
	if k.Verify(signed, 1) || other.Verify(signed, 0) {
		t.Error("Verify on another partition or key: got true, want false")
	}
	for i := range signed {
		b := bytes.Clone(signed)
		b[i] ^= 1
		if k.Verify(b, 0) {
			t.Fatalf("Verify with byte %d altered: got true, want false", i)
		}
	}
	for _, n := range []int{0, 1, pipeline.FrameHeaderLen + pipeline.FrameMACLen - 1, len(signed) - 1} {
		if k.Verify(signed[:n], 0) {
			t.Errorf("Verify of the first %d bytes: got true, want false", n)
		}
	}
	unsigned := pipeline.SealFrame(t, 9, evs)
	if k.Verify(unsigned, 0) {
		t.Error("Verify of an unsigned frame: got true, want false")
	}
	var h, hu pipeline.FrameHeader
	got, err := pipeline.DecodeFrame(signed, &h, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := pipeline.DecodeFrame(unsigned, &hu, nil)
	if h != hu || len(got) != len(want) {
		t.Fatalf("decoded: got %+v and %d events, want %+v and %d", h, len(got), hu, len(want))
	}
	if again := k.Sign(signed[:len(signed)-pipeline.FrameMACLen:len(signed)-pipeline.FrameMACLen], 0); !bytes.Equal(again, signed) {
		t.Error("Sign of the frame without its MAC: want the frame the producer sealed")
	}
	if _, err := pipeline.NewFrameKey(testKey(1)[:pipeline.MinKeyLen-1]); !errors.Is(err, pipeline.ErrConfig) {
		t.Errorf("a key of %d bytes: got %v, want ErrConfig", pipeline.MinKeyLen-1, err)
	}
	if got := testing.AllocsPerRun(100, func() { k.Verify(signed, 0) }); got != 0 {
		t.Errorf("Verify allocs: got %v, want 0", got)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	hex := strings.Repeat("ab", 32)
	key, err := pipeline.ReadKeyFile(write("ok", hex+"\n"))
	if err != nil || string(key) != hex {
		t.Errorf("a 64-character key and a newline: got %q, %v; want the key", key, err)
	}
	for _, tc := range []struct{ name, file, want string }{
		{"short", write("short", strings.Repeat("x", 31)+"\n"), "31 bytes: at least 32 required"},
		{"empty", write("empty", " \n"), "0 bytes"},
		{"missing", filepath.Join(dir, "nope"), "no such file"},
	} {
		if _, err := pipeline.ReadKeyFile(tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestKeyConfig: a key shorter than MinKeyLen is refused by both configs,
// and a producer's frames must hold a MAC besides the longest event.
func TestKeyConfig(t *testing.T) {
	pc := pipeline.DefaultProducerConfig()
	pc.Brokers, pc.Topic, pc.Key = []string{"127.0.0.1:1"}, "t", make([]byte, 31)
	if err := pc.Validate(); err == nil || !strings.Contains(err.Error(), "ProducerConfig.Key = 31 bytes") {
		t.Errorf("producer, 31-byte key: got %v", err)
	}
	pc.Key, pc.FrameBytes = testKey(1), 367
	if err := pc.Validate(); err == nil || !strings.Contains(err.Error(), "FrameBytes = 367: must be at least 398") {
		t.Errorf("producer, key and 367-byte frames: got %v", err)
	}
	cc := pipeline.DefaultConsumerConfig()
	cc.Brokers, cc.Topic, cc.GroupID, cc.Key = []string{"127.0.0.1:1"}, "t", "g", []byte{}
	if err := cc.Validate(); err == nil || !strings.Contains(err.Error(), "ConsumerConfig.Key = 0 bytes") {
		t.Errorf("consumer, empty key: got %v", err)
	}
}

// BenchmarkFrameKey measures signing and verifying a frame of 1024
// typical events, the producer's default frame: one HMAC-SHA256 each.
//
//	go test -run '^$' -bench FrameKey ./pipeline/
func BenchmarkFrameKey(b *testing.B) {
	e := eventtest.Samples()["typical"]
	evs := make([]event.Event, 1024)
	for i := range evs {
		evs[i] = e
		evs[i].KeyHash = uint64(i)
	}
	frame := pipeline.SealSignedFrame(b, testKey(1), 1, evs)
	k, _ := pipeline.NewFrameKey(testKey(1))
	body := frame[: len(frame)-pipeline.FrameMACLen : len(frame)-pipeline.FrameMACLen]
	b.Run("sign", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		buf := make([]byte, 0, len(frame))
		for b.Loop() {
			k.Sign(append(buf[:0], body...), 0)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
	})
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(frame)))
		for b.Loop() {
			if !k.Verify(frame, 0) {
				b.Fatal("Verify: got false")
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
	})
}
