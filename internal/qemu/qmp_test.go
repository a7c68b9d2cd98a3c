package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeConn is the server side of one QMP connection.
type fakeConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

type command struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}`

func (c *fakeConn) send(format string, args ...any) {
	if _, err := fmt.Fprintf(c.c, format+"\r\n", args...); err != nil {
		c.t.Errorf("fake QMP: send: %v", err)
	}
}

// recv reads one command; ok is false once the client has gone.
func (c *fakeConn) recv() (cmd command, ok bool) {
	c.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return cmd, false
	}
	if err := json.Unmarshal(line, &cmd); err != nil {
		c.t.Errorf("fake QMP: %q: %v", line, err)
		return cmd, false
	}
	return cmd, true
}

// expect reads one command and checks its name.
func (c *fakeConn) expect(name string) command {
	cmd, ok := c.recv()
	if ok && cmd.Execute != name {
		c.t.Errorf("fake QMP: got %q, want %q", cmd.Execute, name)
	}
	return cmd
}

// handshake greets and accepts qmp_capabilities.
func (c *fakeConn) handshake() {
	c.send("%s", greeting)
	cmd := c.expect("qmp_capabilities")
	c.send(`{"return": {}, "id": %s}`, cmd.ID)
}

// waitGone waits until the client hangs up.
func (c *fakeConn) waitGone() {
	for {
		if _, ok := c.recv(); !ok {
			return
		}
	}
}

// fakeQMP serves one connection on a unix socket with script and returns
// the socket's path. The script ends when it returns or the client hangs up.
func fakeQMP(t *testing.T, script func(c *fakeConn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		script(&fakeConn{t: t, c: conn, r: bufio.NewReader(conn)})
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return path
}

func dial(t *testing.T, path string) *Monitor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func nextEvent(t *testing.T, m *Monitor) Event {
	t.Helper()
	select {
	case ev, ok := <-m.Events():
		if !ok {
			t.Fatal("events closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	panic("unreachable")
}

// monitorGoroutines counts goroutines running a Monitor's code, after
// giving those that have just said they are done a moment to return.
func monitorGoroutines() int {
	var n int
	for range 100 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if n = strings.Count(string(buf), "qemu.(*Monitor)."); n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func TestDialHandshake(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		cmd := c.expect("query-status")
		if len(cmd.Arguments) != 0 {
			c.t.Errorf("query-status sent arguments %s", cmd.Arguments)
		}
		c.send(`{"return": {"status": "prelaunch", "singlestep": false, "running": false}, "id": %s}`, cmd.ID)
		c.waitGone()
	})
	m := dial(t, path)
	if v := m.Version(); v.String() != "7.2.22" || v.Package != "Debian 1:7.2+dfsg-7" {
		t.Errorf("version %+v", v)
	}
	st, err := m.QueryStatus(context.Background())
	if err != nil || st != (Status{Status: "prelaunch"}) {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
}

func TestDialRefusals(t *testing.T) {
	tests := []struct {
		name   string
		script func(c *fakeConn)
		check  func(err error) bool
	}{
		{"not QMP", func(c *fakeConn) { c.send("220 smtp.example ESMTP"); c.waitGone() },
			func(err error) bool { return errors.Is(err, ErrNotQMP) }},
		{"no greeting", func(c *fakeConn) { c.waitGone() },
			func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
		{"capabilities refused", func(c *fakeConn) {
			c.send("%s", greeting)
			cmd := c.expect("qmp_capabilities")
			c.send(`{"error": {"class": "GenericError", "desc": "no"}, "id": %s}`, cmd.ID)
			c.waitGone()
		}, func(err error) bool { var e *Error; return errors.As(err, &e) && e.Desc == "no" }},
		{"capabilities never answered", func(c *fakeConn) { c.send("%s", greeting); c.waitGone() },
			func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
		{"hang-up after the greeting", func(c *fakeConn) { c.send("%s", greeting); c.expect("qmp_capabilities") },
			func(err error) bool { return errors.Is(err, ErrDisconnected) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fakeQMP(t, tt.script)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			m, err := Dial(ctx, path)
			if err == nil {
				m.Close()
				t.Fatal("Dial succeeded")
			}
			if !tt.check(err) {
				t.Fatalf("Dial: unexpected error %v", err)
			}
			if n := monitorGoroutines(); n != 0 {
				t.Errorf("%d monitor goroutines left after a failed Dial", n)
			}
		})
	}
	t.Run("no socket", func(t *testing.T) {
		_, err := Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
		if err == nil {
			t.Fatal("Dial succeeded")
		}
	})
}

// A command that is never answered ends at its deadline, and its late reply
// is not taken for the next command's.
func TestExecuteDeadline(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		hang := c.expect("hang")
		next := c.expect("query-status")
		c.send(`{"return": {"status": "stale", "running": true}, "id": %s}`, hang.ID)
		c.send(`{"return": {"status": "paused", "running": false}, "id": %s}`, next.ID)
		c.waitGone()
	})
	m := dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Execute(ctx, "hang", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute = %v, want the deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Execute returned %v after a 200ms deadline", d)
	}
	st, err := m.QueryStatus(context.Background())
	if err != nil || st.Status != "paused" {
		t.Fatalf("QueryStatus = %+v, %v; want paused", st, err)
	}
}

func TestEventsAndRepliesInterleaved(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		cmd := c.expect("query-status")
		c.send(`{"timestamp": {"seconds": 1700000000, "microseconds": 250}, "event": "STOP"}`)
		c.send(`{"return": {"status": "running", "running": true}, "id": %s}`, cmd.ID)
		c.send(`{"timestamp": {"seconds": 1700000001, "microseconds": 0}, "event": "RESUME"}`)
		c.send(`{"timestamp": {"seconds": 1700000002, "microseconds": 0}, "event": "GUEST_PANICKED", "data": {"action": "run"}}`)
		c.waitGone()
	})
	m := dial(t, path)
	st, err := m.QueryStatus(context.Background())
	if err != nil || !st.Running {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
	ev := nextEvent(t, m)
	if ev.Name != "STOP" || ev.Data != nil || !ev.Time.Equal(time.Unix(1700000000, 250000)) {
		t.Errorf("first event %+v", ev)
	}
	if ev := nextEvent(t, m); ev.Name != "RESUME" {
		t.Errorf("second event %+v", ev)
	}
	if ev := nextEvent(t, m); ev.Name != "GUEST_PANICKED" || string(ev.Data) != `{"action": "run"}` {
		t.Errorf("third event %+v (data %s)", ev, ev.Data)
	}
}

func TestRepliesOutOfOrder(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		a, _ := c.recv()
		b, _ := c.recv()
		c.send(`{"return": %q, "id": %s}`, b.Execute, b.ID)
		c.send(`{"return": %q, "id": %s}`, a.Execute, a.ID)
		c.waitGone()
	})
	m := dial(t, path)
	var wg sync.WaitGroup
	for _, name := range []string{"first", "second"} {
		wg.Go(func() {
			var got string
			if err := m.Execute(context.Background(), name, nil, &got); err != nil || got != name {
				t.Errorf("Execute(%s) = %q, %v", name, got, err)
			}
		})
	}
	wg.Wait()
}

func TestExecuteArgumentsAndErrors(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		cmd := c.expect("device_del")
		if string(cmd.Arguments) != `{"id":"net0"}` {
			c.t.Errorf("arguments %s", cmd.Arguments)
		}
		c.send(`{"error": {"class": "DeviceNotFound", "desc": "Device 'net0' not found"}, "id": %s}`, cmd.ID)
		c.waitGone()
	})
	m := dial(t, path)
	err := m.Execute(context.Background(), "device_del", map[string]string{"id": "net0"}, nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Command != "device_del" || qe.Class != "DeviceNotFound" || qe.Desc != "Device 'net0' not found" {
		t.Fatalf("Execute = %#v", err)
	}
	if err.Error() != "qmp device_del: DeviceNotFound: Device 'net0' not found" {
		t.Errorf("message %q", err)
	}
}

// A connection dropped in the middle of a call ends the call at once, and
// every later one.
func TestConnectionDroppedMidCall(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		c.expect("cont")
		c.send(`{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "SHUTDOWN", "data": {"guest": false}}`)
		// and hang up without a reply
	})
	m := dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := m.Cont(ctx); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Cont = %v, want ErrDisconnected", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Cont took %v to see the end", d)
	}
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed")
	}
	if !errors.Is(m.Err(), ErrDisconnected) {
		t.Errorf("Err = %v", m.Err())
	}
	if err := m.Stop(ctx); !errors.Is(err, ErrDisconnected) {
		t.Errorf("Stop after the end = %v", err)
	}
	// The event read before the end is still delivered, then the channel closes.
	if ev := nextEvent(t, m); ev.Name != "SHUTDOWN" {
		t.Errorf("event %+v", ev)
	}
	if _, ok := <-m.Events(); ok {
		t.Error("events not closed after the end")
	}
}

// QEMU's quit may close the connection before its reply: that is success.
func TestQuitWithoutReply(t *testing.T) {
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		c.expect("quit")
		c.send(`{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`)
	})
	m := dial(t, path)
	if err := m.Quit(context.Background()); err != nil {
		t.Fatalf("Quit = %v", err)
	}
}

// A caller that does not read events holds up no reply; the events wait.
func TestUnreadEventsDoNotBlockReplies(t *testing.T) {
	const n = 5000
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		cmd := c.expect("query-status")
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "E", "data": {"n": %d}}`+"\n", i)
		}
		c.send("%s", b.String())
		c.send(`{"return": {"status": "running", "running": true}, "id": %s}`, cmd.ID)
		c.waitGone()
	})
	m := dial(t, path)
	if _, err := m.QueryStatus(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		var d struct{ N int }
		if ev := nextEvent(t, m); json.Unmarshal(ev.Data, &d) != nil || d.N != i {
			t.Fatalf("event %d: %s", i, ev.Data)
		}
	}
	if m.Dropped() != 0 {
		t.Errorf("%d dropped", m.Dropped())
	}
}

// Past the queue's bound the oldest events go, and are counted.
func TestEventQueueBound(t *testing.T) {
	const n = maxQueuedEvents + 1000
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		cmd := c.expect("query-status")
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "E", "data": {"n": %d}}`+"\n", i)
		}
		c.send("%s", b.String())
		c.send(`{"return": {"status": "running", "running": true}, "id": %s}`, cmd.ID)
		c.waitGone()
	})
	m := dial(t, path)
	if _, err := m.QueryStatus(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The pump may hold one event beside the full queue.
	if d := m.Dropped(); d != 1000 && d != 999 {
		t.Fatalf("dropped %d, want 999 or 1000", d)
	}
	var last int
	for range n - int(m.Dropped()) {
		var d struct{ N int }
		json.Unmarshal(nextEvent(t, m).Data, &d)
		last = d.N
	}
	if last != n-1 {
		t.Errorf("last event %d, want %d", last, n-1)
	}
}

// Close ends calls in flight, even a write QEMU never reads, and leaves no
// goroutine behind.
func TestCloseEndsEverything(t *testing.T) {
	release := make(chan struct{})
	path := fakeQMP(t, func(c *fakeConn) {
		c.handshake()
		// Read nothing more: the client's big command fills the socket.
		<-release
	})
	t.Cleanup(func() { close(release) })
	m := dial(t, path)
	big := strings.Repeat("x", 8<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := m.Execute(ctx, "big", map[string]string{"x": big}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute = %v, want its deadline", err)
	}
	// The writer is stuck; another call still honours its own deadline.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := m.Stop(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want its deadline", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- m.Execute(context.Background(), "pending", nil, nil) }()
	time.Sleep(50 * time.Millisecond)
	m.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call in flight = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the call in flight")
	}
	if n := monitorGoroutines(); n != 0 {
		t.Errorf("%d monitor goroutines left after Close", n)
	}
	if _, ok := <-m.Events(); ok {
		t.Error("events not closed")
	}
	if err := m.Cont(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Cont after Close = %v", err)
	}
	m.Close() // twice is fine
}
