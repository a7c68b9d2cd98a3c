// Package httpboundtest checks over loopback that a server's operations bound their bodies as httpbound does.
package httpboundtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// Op is an operation to check.
type Op struct {
	Method, Path string // Path with its parameters filled in
	Route        httpbound.Route
	// Header is sent with every request (an api-version).
	Header map[string]string
	// ReadsBody: the operation reads its body, so a slow one is a 408.
	ReadsBody bool
}

// Check sends op to the server at addr twice: with a Content-Length of
// 1 GiB and none of the body, and wants a 413 naming the limit at once;
// with 2 bytes of a 10-byte body and no more, and wants an answer (408 if
// the operation reads its body) and then the connection closed, by the
// server's deadline. A server that waits instead fails the test after 10
// seconds.
func Check(t *testing.T, addr string, op Op) {
	t.Helper()
	CheckTooLarge(t, addr, op)
	CheckSlow(t, addr, op)
}

// head is op's request line and headers, without the body's.
func (op Op) head() string {
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n", op.Method, op.Path)
	for k, v := range op.Header {
		head += k + ": " + v + "\r\n"
	}
	return head
}

// CheckTooLarge is Check's first request.
func CheckTooLarge(t *testing.T, addr string, op Op) {
	t.Helper()
	if !op.Route.Valid() {
		t.Fatalf("%s %s: no body bounds (%+v)", op.Method, op.Path, op.Route)
	}
	head := op.head()
	c, br := dial(t, addr)
	fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n", head, 1<<30)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s, 1 GiB announced: no answer: %v", op.Method, op.Path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := httpbound.TooLargeMessage(op.Route.MaxBodyBytes); resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), want) {
		t.Errorf("%s %s, 1 GiB announced: %d %s, want 413 %q", op.Method, op.Path, resp.StatusCode, b, want)
	}
}

// CheckSlow is Check's second request.
func CheckSlow(t *testing.T, addr string, op Op) {
	t.Helper()
	c, br := dial(t, addr)
	fmt.Fprintf(c, "%sContent-Length: 10\r\n\r\n{\"", op.head())
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s, slow body: no answer: %v", op.Method, op.Path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if op.ReadsBody && resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("%s %s, slow body: %d %s, want 408", op.Method, op.Path, resp.StatusCode, b)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("%s %s, slow body: after the answer the connection is not closed: %v", op.Method, op.Path, err)
	}
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}
