package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/sled-agent/sled-agent/internal/atomicfile"
)

// Zone histories outlive the zones and the agent: a zone removed from the
// config (and torn down) keeps its last status, marked removed, for
// Removed, at most Options.RemovedLen of them, oldest dropped first; and
// with Options.HistoryFile set every zone's history and the removed zones
// are kept in that file, written at most every Options.HistoryWriteEvery
// and when Run returns, and read by New, so that an agent restart loses
// nothing older than that. The file is bounded: maxHistoryFileBytes, by
// keeping fewer of each zone's oldest events, and event details are cut
// to maxEventDetail.

const (
	maxHistoryFileBytes = 512 << 10
	maxEventDetail      = 1 << 10
)

// historyFile is the file's document.
type historyFile struct {
	// Zones are the histories of the zones that were present, by name.
	Zones map[string][]Event `json:"zones"`
	// Removed are the removed zones' last statuses, oldest first.
	Removed []ZoneStatus `json:"removed"`
}

// loadHistory reads the history file, if there is one. A file that cannot
// be read is reported and left for the next write to replace: a history
// is worth keeping, not worth refusing to start over.
func (r *Reconciler) loadHistory() {
	if r.opts.HistoryFile == "" {
		return
	}
	data, err := os.ReadFile(r.opts.HistoryFile)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var doc historyFile
	if err == nil {
		err = json.Unmarshal(data, &doc)
	}
	if err != nil {
		r.log.Warn("zone histories not restored", "file", r.opts.HistoryFile, "err", err)
		return
	}
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	r.store.prior = doc.Zones
	for _, zs := range doc.Removed {
		if zs.RemovedAt != nil {
			r.store.addRemoved(zs, r.opts.RemovedLen)
		}
	}
}

// takePrior returns the history the file held for a zone, once.
func (s *store) takePrior(name string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A copy: the caller's history is edited in place, and a write of the
	// file may be reading this one.
	h := slices.Clone(s.prior[name])
	delete(s.prior, name)
	return h
}

// addRemoved keeps zs, a removed zone's last status, dropping the oldest
// beyond most. The caller holds mu.
func (s *store) addRemoved(zs ZoneStatus, most int) {
	s.removed = slices.DeleteFunc(s.removed, func(o ZoneStatus) bool { return o.Name == zs.Name })
	s.removed = append(s.removed, zs)
	if n := len(s.removed) - most; n > 0 {
		s.removed = slices.Delete(s.removed, 0, n)
	}
}

// Removed returns the last status of a zone removed from the config and
// torn down, by name or id, the newest if there are several: what it was,
// when it went (RemovedAt), and its history.
func (r *Reconciler) Removed(nameOrID string) (ZoneStatus, bool) {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	for _, zs := range slices.Backward(r.store.removed) {
		if zs.Name == nameOrID || zs.ID == nameOrID {
			zs.History = slices.Clone(zs.History)
			return zs, true
		}
	}
	return ZoneStatus{}, false
}

// historyDoc is what the history file would hold now, bounded.
func (r *Reconciler) historyDoc() ([]byte, error) {
	r.store.mu.Lock()
	doc := historyFile{Zones: make(map[string][]Event, len(r.store.zones)+len(r.store.prior)), Removed: slices.Clone(r.store.removed)}
	for name, zs := range r.store.zones {
		doc.Zones[name] = zs.History
	}
	// Histories read at start of zones not seen again yet are kept, the
	// newest RemovedLen of them: zones gone while the agent was down must
	// not pile up from restart to restart.
	var left []string
	for name := range r.store.prior {
		if _, ok := doc.Zones[name]; !ok && len(r.store.prior[name]) > 0 {
			left = append(left, name)
		}
	}
	lastAt := func(name string) time.Time { h := r.store.prior[name]; return h[len(h)-1].At }
	slices.SortFunc(left, func(a, b string) int { return lastAt(b).Compare(lastAt(a)) })
	for _, name := range left[:min(len(left), r.opts.RemovedLen)] {
		doc.Zones[name] = r.store.prior[name]
	}
	r.store.mu.Unlock()
	cut := func(h []Event, keep int) []Event {
		h = slices.Clone(h[max(len(h)-keep, 0):])
		for i := range h {
			if d := h[i].Detail; len(d) > maxEventDetail {
				n := maxEventDetail
				for n > 0 && !utf8.RuneStart(d[n]) { // not in the middle of a rune
					n--
				}
				h[i].Detail = d[:n] + "…"
			}
		}
		return h
	}
	for keep := r.opts.HistoryLen; ; keep /= 2 {
		out := historyFile{Zones: make(map[string][]Event, len(doc.Zones)), Removed: make([]ZoneStatus, len(doc.Removed))}
		for name, h := range doc.Zones {
			out.Zones[name] = cut(h, keep)
		}
		for i, zs := range doc.Removed {
			zs.History = cut(zs.History, keep)
			out.Removed[i] = zs
		}
		data, err := json.Marshal(out)
		if err != nil || len(data) <= maxHistoryFileBytes || keep <= 1 {
			return data, err
		}
	}
}

// keepHistory writes the history file every HistoryWriteEvery while it
// changed, and once more when ctx ends. It runs beside the loop: it only
// reads the store.
func (r *Reconciler) keepHistory(ctx context.Context) {
	if r.opts.HistoryFile == "" {
		return
	}
	var last []byte
	write := func() {
		data, err := r.historyDoc()
		if err == nil && slices.Equal(data, last) {
			return
		}
		if err == nil {
			err = atomicfile.WriteFile(r.opts.HistoryFile, data, atomicfile.Options{Perm: 0o600})
		}
		if err != nil {
			r.log.Warn("zone histories not written", "file", r.opts.HistoryFile, "err", err)
			return
		}
		last = data
	}
	t := time.NewTicker(r.opts.HistoryWriteEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			write()
			return
		case <-t.C:
			write()
		}
	}
}
