//go:build race

package netio

// raceEnabled: the race detector's sync.Pool drops some of what is put
// back, so that pooled objects are allocated again.
const raceEnabled = true
