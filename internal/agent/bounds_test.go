package agent_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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

// Slow clients cannot keep others out: at the cap, a fresh connection is
// served, and the slow connection that waited longest is closed for it.
func TestConnectionsAtTheCapDoNotStarveTheAPI(t *testing.T) {
	a := newAgent(t, agent.Config{DataDir: t.TempDir(), MaxConnections: 4})
	run(t, a)
	// Four slow clients fill the cap: headers, then one byte of their body.
	var slow []*bufio.Reader
	for range 4 {
		c, br := dialAgent(t, a.Addr())
		fmt.Fprint(c, "PUT /omicron-config HTTP/1.1\r\nHost: sled\r\nContent-Length: 100\r\n\r\n{")
		slow = append(slow, br)
	}
	c, br := dialAgent(t, a.Addr())
	fmt.Fprint(c, getInventory)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET /inventory at the cap: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /inventory at the cap: %s", resp.Status)
	}
	// Closed: EOF, or a reset for the byte it sent that was never read;
	// not the test's own deadline.
	if _, err := slow[0].ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the slow client that waited longest: %v, want its connection closed", err)
	}
}
