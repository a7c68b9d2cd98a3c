package reconciler

import "github.com/sled-agent/sled-agent/internal/backoff"

// Backoff chooses the delay before a zone's next attempt after consecutive
// failures (internal/backoff).
type Backoff = backoff.Backoff
