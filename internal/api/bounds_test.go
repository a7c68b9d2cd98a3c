package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/runtime/sim"
)

// boundedSled is the API with every operation registered, served on
// loopback with a short body deadline.
func boundedSled(t *testing.T) (*sled, string) {
	t.Helper()
	s := newSled(t, sim.Options{}, func(d *api.Deps) {
		d.VMMs = noVMMs{}
		d.LocalStorage = &fakeLocalStorage{}
		d.VPC = boundedVPC(t)
		d.BodyReadTimeout = 100 * time.Millisecond
	})
	srv := httptest.NewServer(s.server.Handler())
	t.Cleanup(srv.Close)
	return s, srv.Listener.Addr().String()
}

// rawConn is a connection to addr that fails the test rather than hang it.
func rawConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

// concretePath fills an operation's path parameters.
func concretePath(path string) string {
	return strings.NewReplacer("{propolis_id}", "0b8e3a44-3c1f-4b7e-9d41-6f0f4a9a1c11", "{zone}", "oxz_ntp", "{vpc_id}", "9b5e0c5e-0000-4000-8000-000000000001", "{subnet}", "10.0.0.0%2F24").Replace(path)
}

// Every operation has a body limit and a read deadline, documented, and
// enforced: a Content-Length over the limit is answered 413 at once with
// none of the body sent, and a body that stops coming is cut at its
// deadline, whether the operation reads bodies or not.
func TestEveryOperationIsBounded(t *testing.T) {
	s, addr := boundedSled(t)
	var ids, all []string
	for _, item := range api.Document().Paths {
		for _, op := range []*huma.Operation{item.Get, item.Put, item.Post, item.Delete, item.Patch} {
			if op != nil {
				all = append(all, op.OperationID)
			}
		}
	}
	for path, item := range s.server.OpenAPI().Paths {
		for method, op := range map[string]*huma.Operation{"GET": item.Get, "PUT": item.Put, "POST": item.Post, "DELETE": item.Delete, "PATCH": item.Patch} {
			if op == nil {
				continue
			}
			ids = append(ids, op.OperationID)
			t.Run(op.OperationID, func(t *testing.T) {
				rt, ok := api.Bounds(op)
				if !ok || !rt.Valid() {
					t.Fatalf("%s %s has no body bounds (%+v)", method, path, rt)
				}
				if want := fmt.Sprintf("A request body over %d bytes is refused with 413", rt.MaxBodyBytes); !strings.Contains(op.Description, want) {
					t.Errorf("description %q does not say %q", op.Description, want)
				}
				if !slices.Contains(op.Errors, http.StatusRequestEntityTooLarge) {
					t.Errorf("413 is not among its documented errors %v", op.Errors)
				}
				url := concretePath(path)

				// A gigabyte announced, none of it sent.
				c, br := rawConn(t, addr)
				fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: sled\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, url, 1<<30)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("1 GiB announced: no answer: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				var e api.Error
				json.Unmarshal(b, &e)
				if resp.StatusCode != http.StatusRequestEntityTooLarge || e.ErrorCode != "PayloadTooLarge" || e.Message != httpbound.TooLargeMessage(rt.MaxBodyBytes) || e.RequestID == "" {
					t.Errorf("1 GiB announced: %d %s, want 413 PayloadTooLarge %q", resp.StatusCode, b, httpbound.TooLargeMessage(rt.MaxBodyBytes))
				}

				// Two bytes of ten, then nothing: answered (408 where
				// the body is read), and the connection closed.
				c, br = rawConn(t, addr)
				fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: sled\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"", method, url)
				resp, err = http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("slow body: no answer: %v", err)
				}
				b, _ = io.ReadAll(resp.Body)
				if op.RequestBody != nil && resp.StatusCode != http.StatusRequestTimeout {
					t.Errorf("slow body: %d %s, want 408", resp.StatusCode, b)
				}
				if _, err := br.ReadByte(); err != io.EOF {
					t.Errorf("slow body: after the answer the connection is not closed: %v", err)
				}
			})
		}
	}
	slices.Sort(ids)
	slices.Sort(all)
	if !slices.Equal(ids, all) {
		t.Fatalf("walked %v, the API has %v", ids, all)
	}
}

// PUT /vmms/{id}/state refuses a body of unknown length (chunked) once it
// passes the limit, without reading the rest: the client is stopped after
// about the limit, not after the 64 MiB it offers.
func TestVMMPutStateChunkedOverLimit(t *testing.T) {
	_, addr := boundedSled(t)
	c, br := rawConn(t, addr)
	fmt.Fprint(c, "PUT /vmms/0b8e3a44-3c1f-4b7e-9d41-6f0f4a9a1c11/state HTTP/1.1\r\nHost: sled\r\nTransfer-Encoding: chunked\r\n\r\n")
	const offered = 64 << 20
	sent := make(chan int, 1)
	go func() {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 64<<10, strings.Repeat(" ", 64<<10))
		n := 0
		for n < offered {
			if _, err := io.WriteString(c, chunk); err != nil {
				break
			}
			n += 64 << 10
		}
		sent <- n
	}()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), httpbound.TooLargeMessage(4<<10)) {
		t.Fatalf("%d %s, want 413 naming 4096 bytes", resp.StatusCode, b)
	}
	c.Close()
	if n := <-sent; n >= offered {
		t.Fatalf("the server took all %d bytes offered", n)
	}
}
