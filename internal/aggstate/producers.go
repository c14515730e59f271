// Package aggstate holds what the aggregator (package aggregator) keeps beside
// the judge and exports as metrics: the producer instances behind each edge
// id, and the global tally's count of what it could not hold. It is a
// package of its own so that deploy's tests build the same metrics.
package aggstate

import (
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poplimit/poplimit/global"
	"github.com/poplimit/poplimit/pipeline"
)

// Producers tells apart the producer instances that write frames under one
// edge id, and counts those that do it at the same time: two edges started
// with the same -edge-id, whose per-edge figures the judge merges.
//
// A Producer numbers its frames, on each partition, from a random 64-bit
// start (pipeline's "Frames"), one per instance, so a frame's sequence
// number places it in its instance's run: a frame within instanceGap of a
// known instance's numbers continues it, one outside every known run is a
// new instance. Within one partition frames arrive in the order they were
// written: an edge that restarts shows its old instance's frames, then its
// new one's; two instances live at once interleave, and an instance whose
// frames come again on a partition after another's did is live beside it.
type Producers struct {
	log     *slog.Logger
	mu      sync.Mutex
	edges   map[uint16]*edgeInstances
	streams map[streamID]*stream
	shared  *prometheus.CounterVec
	labels  map[uint16]struct{} // edge ids with a label value of their own
	nextID  uint64
}

// instanceGap is how far apart two frames' numbers may be and still be one
// instance's: far more frames than an instance writes in its life, far
// fewer than separate two random starts (two starts fall within it of each
// other with probability 2^-30).
const instanceGap = 1 << 32

// Bounds of what is remembered: instances per edge id (the least recently
// seen is forgotten), and (edge, partition) streams (past it, new streams
// are not followed).
const (
	maxInstancesPerEdge = 8
	maxStreams          = 1 << 14
	maxEdgeLabels       = 256 // edge ids with a label value of their own; the rest share "_other"
)

type instance struct {
	id     uint64
	lo, hi uint64 // the sequence numbers seen
	seen   uint64 // a clock of frames: the latest frame of this instance
	shared bool   // counted as writing beside another
}

type edgeInstances struct {
	list  []instance
	clock uint64
}

type streamID struct {
	edge      uint16
	partition int
}

// stream is what one (edge, partition) has shown: the instances seen on it,
// the last one latest.
type stream struct {
	ids []uint64
}

// NewProducers returns an empty Producers that logs to log and whose metric
// (poplimit_aggregator_shared_edge_id_producers_total) is registered with
// reg.
func NewProducers(log *slog.Logger, reg prometheus.Registerer) *Producers {
	p := &Producers{log: log, edges: map[uint16]*edgeInstances{}, streams: map[streamID]*stream{}, labels: map[uint16]struct{}{},
		shared: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "aggregator",
			Name: "shared_edge_id_producers_total",
			Help: "Producer instances found writing decision events under an edge id at the same time as another " +
				"(two edges with one -edge-id: their per-edge figures are merged), by edge id (256 ids at most, then _other)."}, []string{"edge"})}
	reg.MustRegister(p.shared)
	return p
}

// Frame notes a frame read from partition, with header h: it is the
// consumer's pipeline.ConsumerConfig.OnFrame. Safe for concurrent use.
func (p *Producers) Frame(partition int, h *pipeline.FrameHeader) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.edges[h.Edge]
	if e == nil {
		e = &edgeInstances{}
		p.edges[h.Edge] = e
	}
	e.clock++
	in := e.find(h.Seq)
	if in == nil {
		if len(e.list) == maxInstancesPerEdge {
			oldest := 0
			for i := range e.list {
				if e.list[i].seen < e.list[oldest].seen {
					oldest = i
				}
			}
			e.list = slices.Delete(e.list, oldest, oldest+1)
		}
		p.nextID++
		e.list = append(e.list, instance{id: p.nextID, lo: h.Seq, hi: h.Seq})
		in = &e.list[len(e.list)-1]
	}
	in.lo, in.hi, in.seen = min(in.lo, h.Seq), max(in.hi, h.Seq), e.clock

	sid := streamID{h.Edge, partition}
	s := p.streams[sid]
	if s == nil {
		if len(p.streams) >= maxStreams {
			return
		}
		s = &stream{}
		p.streams[sid] = s
	}
	n := len(s.ids)
	switch {
	case n > 0 && s.ids[n-1] == in.id:
		return
	case slices.Contains(s.ids, in.id):
		// in wrote on this partition before another did, and writes
		// again: both live at once.
		other := s.ids[n-1]
		p.mark(e, in, h.Edge, partition)
		if o := e.byID(other); o != nil {
			p.mark(e, o, h.Edge, partition)
		}
		s.ids = slices.DeleteFunc(s.ids, func(id uint64) bool { return id == in.id })
	}
	s.ids = append(s.ids, in.id)
	if len(s.ids) > maxInstancesPerEdge {
		s.ids = s.ids[1:]
	}
}

// mark counts in as writing beside another instance, once.
func (p *Producers) mark(e *edgeInstances, in *instance, edge uint16, partition int) {
	if in.shared {
		return
	}
	in.shared = true
	label := strconv.Itoa(int(edge))
	if _, ok := p.labels[edge]; !ok {
		if len(p.labels) >= maxEdgeLabels {
			label = "_other"
		} else {
			p.labels[edge] = struct{}{}
		}
	}
	p.shared.WithLabelValues(label).Inc()
	live := 0
	for i := range e.list {
		if e.list[i].shared {
			live++
		}
	}
	p.log.Warn("aggregator: two or more producers write under one edge id at the same time: "+
		"their per-edge figures are merged; give each edge its own -edge-id",
		"edge", edge, "partition", partition, "producers_sharing", live)
}

func (e *edgeInstances) find(seq uint64) *instance {
	for i := range e.list {
		in := &e.list[i]
		if seq >= in.lo-min(in.lo, instanceGap) && seq <= in.hi+min(^in.hi, instanceGap) {
			return in
		}
	}
	return nil
}

func (e *edgeInstances) byID(id uint64) *instance {
	for i := range e.list {
		if e.list[i].id == id {
			return &e.list[i]
		}
	}
	return nil
}

// TallyDropped returns a counter of the events of global rules' keys that
// tally did not count because it held TallyConfig.MaxKeys keys
// (poplimit_aggregator_global_tally_dropped_events_total).
func TallyDropped(tally *global.Tally) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "poplimit", Subsystem: "aggregator",
		Name: "global_tally_dropped_events_total",
		Help: "Events of global rules' keys not counted for the global topic because -global-max-keys keys were counted."},
		func() float64 { _, dropped := tally.Keys(); return float64(dropped) })
}
