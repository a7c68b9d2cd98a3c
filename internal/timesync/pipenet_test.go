package timesync

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
)

// fakeNet is an in-memory network of HTTP servers for tests in a synctest
// bubble, where real sockets would stop the fake clock: each address
// served is an http.Server on net.Pipe connections, and a client dials
// them through Client. An address nobody serves refuses connections.
type fakeNet struct {
	t       *testing.T
	mu      sync.Mutex
	servers map[string]*pipeListener // guarded by mu; by host:port
	wg      sync.WaitGroup
}

func newFakeNet(t *testing.T) *fakeNet {
	return &fakeNet{t: t, servers: map[string]*pipeListener{}}
}

// serve serves h at addr (host:port, IPv6 hosts in brackets) until stop
// or close.
func (n *fakeNet) serve(addr string, h http.Handler) {
	ln := &pipeListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h}
	ln.srv = srv
	n.mu.Lock()
	if _, ok := n.servers[addr]; ok {
		n.t.Fatalf("%s is served already", addr)
	}
	n.servers[addr] = ln
	n.mu.Unlock()
	n.wg.Go(func() { srv.Serve(ln) })
}

// stop stops serving addr: it refuses connections from then on.
func (n *fakeNet) stop(addr string) {
	n.mu.Lock()
	ln := n.servers[addr]
	delete(n.servers, addr)
	n.mu.Unlock()
	if ln != nil {
		ln.srv.Close()
	}
}

// close stops every server and waits for them; call it before the bubble
// ends.
func (n *fakeNet) close() {
	n.mu.Lock()
	lns := n.servers
	n.servers = map[string]*pipeListener{}
	n.mu.Unlock()
	for _, ln := range lns {
		ln.srv.Close()
	}
	n.wg.Wait()
}

// Client is an HTTP client of the fake network, set up as the watcher's
// default client is (no keep-alive, no redirects).
func (n *fakeNet) Client() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				n.mu.Lock()
				ln := n.servers[addr]
				n.mu.Unlock()
				if ln == nil {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
				}
				client, server := net.Pipe()
				select {
				case ln.conns <- server:
					return client, nil
				case <-ln.done:
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

type pipeListener struct {
	addr  string
	srv   *http.Server
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.addr) }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

var _ net.Listener = (*pipeListener)(nil)
