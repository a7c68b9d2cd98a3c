// Package simhttptest sends the raw requests, and checks the error bodies,
// that tests of simhttp servers need.
package simhttptest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/httpbound/httpboundtest"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// Deadline bounds every request Do sends; nothing asserts how fast
// anything is.
const Deadline = 20 * time.Second

// Answer is a raw HTTP answer.
type Answer struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends a request a client would never send, with http.DefaultClient.
// version "" omits the api-version header, contentType "" omits
// Content-Type and body "" sends no body.
func Do(t testing.TB, method, url, version, contentType, body string) Answer {
	t.Helper()
	a, err := Send(t.Context(), method, url, version, contentType, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Send is Do for any goroutine: it returns what went wrong instead of
// failing the test.
func Send(ctx context.Context, method, url, version, contentType, body string) (Answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(ctx, Deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Answer{}, err
	}
	if version != "" {
		req.Header.Set("api-version", version)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	return Answer{resp.StatusCode, resp.Header, string(b)}, nil
}

// CheckErrorBody checks that a carries the upstream error body
// {"request_id": <uuid>, "error_code"?, "message": <non-empty>} and
// nothing else, and returns its error_code.
func CheckErrorBody(t testing.TB, a Answer) string {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal([]byte(a.Body), &body); err != nil {
		t.Fatalf("error body %q: %v", a.Body, err)
	}
	id, _ := body["request_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		t.Errorf("error body %s: request_id is not a uuid", a.Body)
	}
	if msg, _ := body["message"].(string); msg == "" {
		t.Errorf("error body %s: no message", a.Body)
	}
	for k := range body {
		if k != "request_id" && k != "message" && k != "error_code" {
			t.Errorf("error body %s: unexpected field %q", a.Body, k)
		}
	}
	code, _ := body["error_code"].(string)
	return code
}

// Operations is what CheckBounds needs of a simulator (a simhttp.Server).
type Operations interface {
	Operations() []simhttp.Operation
	Addr() string
}

// CheckBounds walks every route of the started simulator s: each has body
// bounds, and a Content-Length over its limit is answered 413 at once,
// naming it, with none of the body sent; with slow, a body that stops
// coming is also cut at its deadline (s must have a short
// BodyReadTimeout). version is the api-version sent.
func CheckBounds(t *testing.T, s Operations, version string, slow bool) {
	t.Helper()
	ops := s.Operations()
	if len(ops) == 0 {
		t.Fatal("no operations")
	}
	fill := regexp.MustCompile(`\{[^}]+\}`)
	for _, op := range ops {
		t.Run(op.Method+" "+op.Path, func(t *testing.T) {
			o := httpboundtest.Op{
				Method: op.Method,
				Path:   fill.ReplaceAllString(op.Path, "1"),
				Route:  op.Bounds,
				Header: map[string]string{"api-version": version},
			}
			httpboundtest.CheckTooLarge(t, s.Addr(), o)
			if slow {
				httpboundtest.CheckSlow(t, s.Addr(), o)
			}
		})
	}
}
