package reconciler

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The history file stays within its bound however long the histories and
// their details: the oldest events go first, and details are cut.
func TestHistoryFileIsBounded(t *testing.T) {
	r := New(nil, nil, Options{})
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	long := strings.Repeat("é", maxEventDetail) // twice the bound in bytes
	for z := range 40 {
		name := fmt.Sprintf("oxz_crucible_%02d", z)
		var h []Event
		for i := range r.opts.HistoryLen {
			h = append(h, Event{At: at.Add(time.Duration(i) * time.Second), Event: fmt.Sprint("event ", i), Detail: long})
		}
		r.store.zones[name] = ZoneStatus{Name: name, History: h}
	}
	data, err := r.historyDoc()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > maxHistoryFileBytes {
		t.Fatalf("history file of %d bytes, want at most %d", len(data), maxHistoryFileBytes)
	}
	var doc historyFile
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	h := doc.Zones["oxz_crucible_00"]
	if len(h) == 0 || len(h) == r.opts.HistoryLen {
		t.Fatalf("%d events kept of %d, want fewer but some", len(h), r.opts.HistoryLen)
	}
	if last := h[len(h)-1]; last.Event != fmt.Sprint("event ", r.opts.HistoryLen-1) {
		t.Errorf("last event kept %q, want the newest", last.Event)
	}
	if d := h[0].Detail; len(d) > maxEventDetail+len("…") || !strings.HasSuffix(d, "é…") {
		t.Errorf("detail of %d bytes (%q…), want cut at a rune to at most %d", len(d), d[:8], maxEventDetail)
	}
}
