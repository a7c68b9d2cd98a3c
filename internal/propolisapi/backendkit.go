package propolisapi

import (
	"bytes"
	"context"
	"encoding/json"
)

// WaitFor is Backend.Wait for a backend that keeps its status under its own
// lock: current returns the status and a channel closed at its next change.
// It returns the status once its Gen is above after, or the current status
// when ctx ends.
func WaitFor(ctx context.Context, after uint64, current func() (Status, <-chan struct{})) Status {
	for {
		st, changed := current()
		if st.Gen > after {
			return st
		}
		select {
		case <-ctx.Done():
			st, _ = current()
			return st
		case <-changed:
		}
	}
}

// SameSpec reports whether two instance specs are the same JSON, whatever
// their spacing: an Ensure again with the same spec changes nothing.
func SameSpec(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}
