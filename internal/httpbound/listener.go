package httpbound

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// MaxConns is the default cap on a server's connections: a quarter of the
// process's file descriptor limit (a process may run more than one server,
// and it opens files too), and no more than 4096, far more than the control
// plane needs.
func MaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return 256
	}
	return int(min(4096, max(lim.Cur/4, 16)))
}

// refuseLogEvery bounds how often a listener logs that it refuses
// connections.
const refuseLogEvery = 10 * time.Second

// Listener is ln holding at most max connections at once. A connection
// beyond the cap is accepted and closed at once, so that the excess never
// takes the process to its file descriptor limit (where accept fails with
// EMFILE and every client waits) and is told at once to go away. Refusals
// are logged at most every 10 seconds, with their count.
func Listener(ln net.Listener, max int, log *slog.Logger) *CappedListener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &CappedListener{Listener: ln, max: int64(max), log: log}
}

// CappedListener is a listener with a cap on the connections it holds.
type CappedListener struct {
	net.Listener
	max  int64
	log  *slog.Logger
	open atomic.Int64

	mu sync.Mutex
	// The fields below are guarded by mu.
	refused int // since the last log line
	lastLog time.Time
}

// Open is the number of connections held.
func (l *CappedListener) Open() int { return int(l.open.Load()) }

// Accept returns the next connection under the cap.
func (l *CappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &conn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		c.Close()
		l.refusedOne()
	}
}

func (l *CappedListener) refusedOne() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused++
	if now := time.Now(); now.Sub(l.lastLog) >= refuseLogEvery {
		l.log.Warn("refusing connections over the cap", "addr", l.Addr().String(), "cap", l.max, "refused", l.refused)
		l.refused, l.lastLog = 0, now
	}
}

// conn gives back its place under the cap when closed.
type conn struct {
	net.Conn
	l    *CappedListener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
