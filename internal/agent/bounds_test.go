package agent_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/agent"
)

// dialAgent connects to the agent; a hung answer fails the test.
func dialAgent(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

const getInventory = "GET /inventory HTTP/1.1\r\nHost: sled\r\n\r\n"

// Slow clients take connections up to the cap and no further: a connection
// beyond it is closed at once, and one below it is served.
func TestConnectionsOverTheCapAreClosed(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir(), MaxConnections: 4})
	run(t, a)
	// Three slow clients: headers, then one byte of their body.
	for range 3 {
		c, _ := dialAgent(t, a.Addr())
		fmt.Fprint(c, "PUT /omicron-config HTTP/1.1\r\nHost: sled\r\nContent-Length: 100\r\n\r\n{")
	}
	// A fresh connection, the fourth, is served, and kept.
	c, br := dialAgent(t, a.Addr())
	fmt.Fprint(c, getInventory)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET /inventory below the cap: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /inventory below the cap: %s", resp.Status)
	}
	// A fifth is over the cap: closed without an answer.
	c, br = dialAgent(t, a.Addr())
	fmt.Fprint(c, getInventory)
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("GET /inventory over the cap answered %s, want the connection closed", resp.Status)
	}
}
