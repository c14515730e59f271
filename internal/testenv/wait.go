package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/poplimit/poplimit/event"
	"github.com/poplimit/poplimit/internal/metricsum"
	"github.com/poplimit/poplimit/pipeline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// WaitFor polls cond every 10 ms until it holds, or fails the test after
// timeout, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// MetricSum is metricsum.Sum, failing the test if g cannot be gathered.
func MetricSum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, err := metricsum.Sum(g, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// TopicEvents reads a topic's partitions whole and counts the events of
// its distinct frames (a frame logged twice counts once, as the consumer
// applies it once) and of its single-event messages.
func TopicEvents(t testing.TB, addr, topic string, partitions int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[[3]uint64]bool{}
	var n int64
	var evs []event.Event
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		last, err := conn.ReadLastOffset()
		if err != nil {
			t.Fatalf("partition %d: last offset: %v", p, err)
		}
		conn.Seek(0, kafka.SeekAbsolute)
		for off := int64(0); off < last; {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			batch := conn.ReadBatch(1, 16<<20)
			for {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				off = m.Offset + 1
				if !pipeline.IsFrame(m.Value) {
					n++
					continue
				}
				var h pipeline.FrameHeader
				if evs, err = pipeline.DecodeFrame(m.Value, &h, evs[:0]); err != nil {
					t.Fatalf("partition %d offset %d: %v", p, m.Offset, err)
				}
				id := [3]uint64{uint64(h.Edge), uint64(p), h.Seq}
				if !seen[id] {
					seen[id] = true
					n += int64(len(evs))
				}
			}
			if err := batch.Close(); err != nil && off < last {
				t.Fatalf("partition %d at offset %d of %d: %v", p, off, last, err)
			}
		}
		conn.Close()
	}
	return n
}

// WaitCommitted waits until group has committed every partition of topic
// up to the log's end. A consumer that commits only what it has applied
// has then applied every message the log holds, copies included: the
// signal that nothing more can arrive, where a sleep would only make it
// likely.
func WaitCommitted(t testing.TB, timeout time.Duration, addr, topic, group string, partitions int) {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second}
	ids := make([]int, partitions)
	last := make([]kafka.OffsetRequest, partitions)
	for p := range partitions {
		ids[p], last[p] = p, kafka.LastOffsetOf(p)
	}
	var behind string
	caught := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ends, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: last}})
		if err != nil {
			behind = err.Error()
			return false
		}
		done, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
		if err != nil {
			behind = err.Error()
			return false
		}
		committed := map[int]int64{}
		for _, p := range done.Topics[topic] {
			committed[p.Partition] = p.CommittedOffset
		}
		for _, p := range ends.Topics[topic] {
			if c := committed[p.Partition]; p.Error != nil || (c < p.LastOffset && p.LastOffset > 0) {
				behind = fmt.Sprintf("partition %d: committed %d of %d", p.Partition, committed[p.Partition], p.LastOffset)
				return false
			}
		}
		return len(ends.Topics[topic]) == partitions
	}
	for deadline := time.Now().Add(timeout); !caught(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for group %s to commit %s to its end: %s", timeout, group, topic, behind)
		}
	}
}
