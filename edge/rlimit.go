package edge

import (
	"log/slog"

	"github.com/poplimit/poplimit/httpedge"
)

// FileLimit is the process's open-file limit (RLIMIT_NOFILE).
type FileLimit struct {
	Soft, Hard uint64
}

// filesReserve is the descriptors an edge holds besides its traffic
// connections and upstream pools, at most: store and broker connections,
// the admin and rate limit service listeners and their clients, files.
const filesReserve = 256

// FilesNeeded returns how many file descriptors o's edge may hold open at
// once: one per traffic connection up to Server.Concurrency, and the
// rest (filesBesides).
func (o Options) FilesNeeded() uint64 {
	o = o.withDefaults()
	return uint64(o.Server.Concurrency) + o.filesBesides()
}

// filesBesides is the descriptors o's edge may hold besides its traffic
// connections: the upstream connection pools in proxy mode, the admin
// listener's connections, and a reserve for the rest.
func (o Options) filesBesides() uint64 {
	n := uint64(filesReserve) + uint64(max(o.AdminMaxConns, 0))
	if o.Server.Mode == httpedge.Proxy {
		ups, _ := httpedge.ParseUpstreams(o.Server.Upstream)
		n += uint64(len(ups)) * uint64(o.Server.UpstreamConns)
	}
	return n
}

// ConnsFor returns the traffic connections o's edge holds open at most
// (the default of Server.MaxConns) under an open-file limit of soft
// descriptors: the limit less what the edge holds besides them
// (FilesNeeded's reserve, the admin listener's AdminMaxConns, the
// upstream pools), but at least half the limit, and at most
// Server.Concurrency. An unknown limit (0) gives Concurrency.
func (o Options) ConnsFor(soft uint64) int {
	o = o.withDefaults()
	if soft == 0 {
		return o.Server.Concurrency
	}
	n := soft / 2
	if besides := o.filesBesides(); soft > besides {
		n = max(n, soft-besides)
	}
	return int(min(n, uint64(o.Server.Concurrency)))
}

// CurrentFileLimit returns the process's open-file limit, zero where it
// cannot be read.
func CurrentFileLimit() FileLimit {
	lim, _ := fileLimit()
	return lim
}

// RaiseFileLimit raises the process's soft open-file limit to its hard
// limit, as a server holding a descriptor per connection needs, and logs
// the limit in force: a warning when it is below o.FilesNeeded(), where
// the default Server.MaxConns (ConnsFor) caps connections below
// Concurrency. It changes the whole process, so it is
// for main, not for Build.
func RaiseFileLimit(o Options, log *slog.Logger) (FileLimit, error) {
	lim, err := raiseFileLimit()
	logFileLimit(log, lim, err, o.FilesNeeded(), o.withDefaults().Server.Concurrency)
	return lim, err
}

func logFileLimit(log *slog.Logger, lim FileLimit, err error, need uint64, concurrency int) {
	if err != nil {
		log.Warn("edge: open-file limit not raised", "soft", lim.Soft, "hard", lim.Hard, "err", err)
		if lim == (FileLimit{}) {
			return // unknown
		}
	}
	if lim.Soft < need {
		log.Warn("edge: the open-file limit is below what -concurrency needs: traffic connections are capped below it by default "+
			"(-max-conns; with -max-conns -1, new connections past it wait in the kernel's backlog); raise the hard limit "+
			"(systemd LimitNOFILE=, ulimit -Hn) or lower -concurrency",
			"open_files", lim.Soft, "needed", need, "concurrency", concurrency)
		return
	}
	log.Info("edge: open-file limit", "open_files", lim.Soft, "needed", need)
}
