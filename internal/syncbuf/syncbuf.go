// Package syncbuf is a bytes.Buffer that may be written and read at once,
// for tests that read a log or a process's output while it is written.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent use; the zero value is empty.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
