package httpbound

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
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

// overCapLogEvery bounds how often a listener logs what it does over its
// cap.
const overCapLogEvery = 10 * time.Second

// Listener is ln holding at most max connections at once, so that clients
// never take the process to its file descriptor limit (where accept fails
// with EMFILE and every client waits).
//
// At the cap, a new connection takes the place of the one that has waited
// longest without being served: a connection is served from when its
// request is in (headers, and the body if any, read by a server made by
// NewServer whose routes Apply a Route) until its answer is written, and
// for good once upgraded. So clients that send slowly, or hold idle
// connections, cannot keep others out; they lose their place to the next
// one. Only when every connection is being served is a new one refused:
// accepted and closed at once. Both are logged at most every 10 seconds,
// with their counts.
func Listener(ln net.Listener, max int, log *slog.Logger) *CappedListener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &CappedListener{Listener: ln, max: max, log: log}
}

// CappedListener is a listener with a cap on the connections it holds.
type CappedListener struct {
	net.Listener
	max int
	log *slog.Logger

	mu sync.Mutex
	// The fields below are guarded by mu.
	open int
	// waiting are the open connections not being served, the one waiting
	// longest first.
	waiting          list.List
	evicted, refused int // since the last log line
	lastLog          time.Time
}

// Open is the number of connections held.
func (l *CappedListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Accept returns the next connection under the cap.
func (l *CappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		var victim *conn
		if l.open >= l.max {
			if e := l.waiting.Front(); e != nil {
				victim = e.Value.(*conn)
				victim.dropLocked()
				l.evicted++
			}
		}
		if l.open >= l.max {
			l.refused++
			l.logLocked()
			l.mu.Unlock()
			c.Close()
			continue
		}
		nc := &conn{Conn: c, l: l}
		l.open++
		nc.elem = l.waiting.PushBack(nc)
		if victim != nil {
			l.logLocked()
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close()
		}
		return nc, nil
	}
}

func (l *CappedListener) logLocked() {
	if now := time.Now(); now.Sub(l.lastLog) >= overCapLogEvery {
		l.log.Warn("connections over the cap: the longest waiting ones closed, or new ones refused when every one is being served",
			"addr", l.Addr().String(), "cap", l.max, "closed_waiting", l.evicted, "refused", l.refused)
		l.evicted, l.refused, l.lastLog = 0, 0, now
	}
}

// conn gives back its place under the cap when closed.
type conn struct {
	net.Conn
	l *CappedListener
	// The fields below are guarded by l.mu.
	closed bool
	elem   *list.Element // in l.waiting while not being served
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	c.dropLocked()
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// dropLocked gives back c's place.
func (c *conn) dropLocked() {
	if c.closed {
		return
	}
	c.closed = true
	c.l.open--
	if c.elem != nil {
		c.l.waiting.Remove(c.elem)
		c.elem = nil
	}
}

// setServed records whether c is being served.
func (c *conn) setServed(served bool) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	switch {
	case c.closed:
	case served && c.elem != nil:
		c.l.waiting.Remove(c.elem)
		c.elem = nil
	case !served && c.elem == nil:
		c.elem = c.l.waiting.PushBack(c)
	}
}

// connKey is the request context key of a capped connection.
type connKey struct{}

// connContext keeps a capped connection in its requests' context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*conn); ok {
		return context.WithValue(ctx, connKey{}, cc)
	}
	return ctx
}

// connState follows the server's view of a capped connection: idle is
// waiting again, upgraded is served for good.
func connState(c net.Conn, st http.ConnState) {
	cc, ok := c.(*conn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		cc.setServed(false)
	case http.StateHijacked:
		cc.setServed(true)
	}
}

// served marks r's connection as being served (its request is in).
func served(r *http.Request) {
	if cc, ok := r.Context().Value(connKey{}).(*conn); ok {
		cc.setServed(true)
	}
}
