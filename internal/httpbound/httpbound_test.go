package httpbound

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve serves h behind rt's bounds on a loopback listener capped at
// maxConns, and returns its address. The handler answers what Status says
// of a failed read, else 200 with the body's length.
func serve(t *testing.T, rt Route, maxConns int, h http.HandlerFunc) (string, *CappedListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := Listener(ln, maxConns, nil)
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			if st, msg := Status(err); st != 0 {
				http.Error(w, msg, st)
				return
			}
			fmt.Fprint(w, n)
		}
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rt.Apply(w, r); err != nil {
			st, msg := Status(err)
			http.Error(w, msg, st)
			return
		}
		h(w, r)
	}))
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), cl
}

// countingConn counts what the server is sent.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a hung server fails the test, not the run
	return c
}

func status(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func TestContentLengthOverLimitRefusedBeforeReading(t *testing.T) {
	var read atomic.Bool
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: time.Minute}, 10, func(w http.ResponseWriter, r *http.Request) {
		read.Store(true)
	})
	c := dial(t, addr)
	// A gigabyte announced, none of it sent: the answer cannot wait for it.
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 1<<30)
	st, msg := status(t, c)
	if st != http.StatusRequestEntityTooLarge || msg != TooLargeMessage(100) {
		t.Fatalf("answer %d %q, want 413 %q", st, msg, TooLargeMessage(100))
	}
	if read.Load() {
		t.Fatal("the handler ran")
	}
	// The connection is closed, not left reading the body.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the answer: %v, want EOF", err)
	}
}

func TestBodyAtLimitAccepted(t *testing.T) {
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: time.Minute}, 10, nil)
	c := dial(t, addr)
	fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n%s", strings.Repeat("a", 100))
	if st, msg := status(t, c); st != 200 || msg != "100" {
		t.Fatalf("answer %d %q, want 200 100", st, msg)
	}
}

func TestChunkedOverLimitCutWhileReading(t *testing.T) {
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: time.Minute}, 10, nil)
	c := dial(t, addr)
	fmt.Fprint(c, "PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	// Chunks keep coming until the server answers; it must answer after
	// about the limit, not after the client is done.
	sent := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sent < 1<<20 {
			if _, err := fmt.Fprintf(c, "40\r\n%s\r\n", strings.Repeat("b", 64)); err != nil {
				return
			}
			sent += 64
		}
	}()
	st, msg := status(t, c)
	if st != http.StatusRequestEntityTooLarge || msg != TooLargeMessage(100) {
		t.Fatalf("answer %d %q, want 413 %q", st, msg, TooLargeMessage(100))
	}
	c.Close()
	<-done
}

func TestSlowBodyCutAtDeadline(t *testing.T) {
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: 50 * time.Millisecond}, 10, nil)
	c := dial(t, addr)
	fmt.Fprint(c, "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	// The rest never comes.
	st, msg := status(t, c)
	if st != http.StatusRequestTimeout || msg != TimeoutMessage {
		t.Fatalf("answer %d %q, want 408 %q", st, msg, TimeoutMessage)
	}
}

// A handler that outlives the body's deadline (a long poll) is not cut
// by it once the body is in.
func TestDeadlineLiftedOnceBodyIsIn(t *testing.T) {
	const d = 20 * time.Millisecond
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: d}, 10, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		select {
		case <-time.After(10 * d):
			fmt.Fprint(w, "waited")
		case <-r.Context().Done():
			http.Error(w, "cancelled", 500)
		}
	})
	c := dial(t, addr)
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
	if st, msg := status(t, c); st != 200 || msg != "waited" {
		t.Fatalf("answer %d %q, want 200 waited", st, msg)
	}
}

// A request without a body leaves the connection without a read deadline:
// an upgraded connection lives on.
func TestNoBodyNoDeadline(t *testing.T) {
	const d = 20 * time.Millisecond
	addr, _ := serve(t, Route{MaxBodyBytes: 100, ReadTimeout: d}, 10, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n\r\n")
		brw.Flush()
		time.Sleep(10 * d)
		b, err := brw.ReadByte()
		if err != nil {
			brw.WriteString("read failed: " + err.Error())
		} else {
			brw.WriteString("read " + string(b))
		}
		brw.Flush()
	})
	c := dial(t, addr)
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "101") {
		t.Fatalf("upgrade: %q %v", line, err)
	}
	br.ReadString('\n')
	fmt.Fprint(c, "z")
	got, _ := io.ReadAll(br)
	if string(got) != "read z" {
		t.Fatalf("upgraded connection: %q, want %q", got, "read z")
	}
}

// At the cap, a new connection takes the place of the one that has waited
// longest without being served: slow clients cannot keep others out.
func TestListenerClosesLongestWaitingAtCap(t *testing.T) {
	addr, cl := serve(t, Small, 2, nil)
	// Two slow clients hold the cap: headers, then one byte of ten.
	var slow []net.Conn
	for range 2 {
		c := dial(t, addr)
		fmt.Fprint(c, "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\na")
		slow = append(slow, c)
		waitOpen(t, cl, len(slow))
	}
	// A third is served, and the first slow one is closed for it.
	c := dial(t, addr)
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	if st, _ := status(t, c); st != 200 {
		t.Fatalf("at the cap: %d, want 200", st)
	}
	// Closed: EOF, or a reset for the byte it sent that was never read;
	// not the test's own deadline.
	if _, err := slow[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the longest waiting connection: %v, want it closed", err)
	}
	if cl.Open() != 2 {
		t.Fatalf("%d connections open, want the cap, 2", cl.Open())
	}
}

// When every connection is being served, one more is refused: closed at
// once.
func TestListenerRefusesWhenAllServed(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	addr, cl := serve(t, Small, 2, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-release // a long poll
	})
	for i := range 2 {
		c := dial(t, addr)
		fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		waitOpen(t, cl, i+1)
	}
	waitFor(t, "both served", func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return cl.waiting.Len() == 0
	})
	c := dial(t, addr)
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	_, err := bufio.NewReader(c).ReadByte()
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("over the cap with every connection served: %v, want closed", err)
	}
}

// waitOpen waits (boundedly) for the listener to hold n connections.
func waitOpen(t *testing.T, cl *CappedListener, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d connections open", n), func() bool { return cl.Open() == n })
}

// waitFor waits (boundedly) for ok.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: gave up", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
