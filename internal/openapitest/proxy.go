package openapitest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// Proxy forwards every request it gets to a server of the document and
// checks each exchange with Check, failing the test on a mismatch: put it
// between one of our clients and a simulator, and both the client's
// requests and the simulator's answers are validated. A request carrying
// header InvalidRequest (which is not forwarded) is one the test makes
// deliberately wrong: only its answer is checked.
// InvalidRequest marks a request the test sends deliberately wrong.
const InvalidRequest = "Openapitest-Invalid-Request"

type Proxy struct {
	// URL is the proxy's base URL, on loopback.
	URL string

	spec   *Spec
	t      testing.TB
	target string
	client *http.Client

	mu   sync.Mutex
	seen map[string][]int // "METHOD /path/{template}" → statuses answered
}

// Proxy starts a proxy to target, a base URL like "http://127.0.0.1:8000";
// it is closed when the test ends.
func (s *Spec) Proxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{spec: s, t: t, target: target, client: &http.Client{}, seen: map[string][]int{}}
	srv := httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(p.client.CloseIdleConnections)
	p.URL = srv.URL
	return p
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	invalid := out.Header.Get(InvalidRequest) != ""
	out.Header.Del(InvalidRequest)
	resp, err := p.client.Do(out)
	if err != nil {
		// No answer (a simulated refusal or hang): nothing to check.
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		p.upgrade(w, r, out, body, invalid, resp)
		return
	}
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	// What Check sees is what the server was sent: the target's URL.
	x := Exchange{Request: out, RequestBody: body, Status: resp.StatusCode, Header: resp.Header, Body: answer}
	check := p.spec.Check
	if invalid {
		check = p.spec.CheckAnswer
	}
	if err := check(x); err != nil {
		p.t.Errorf("%v\nrequest: %s %s %s\nanswer: %d %s", err, r.Method, r.URL, body, resp.StatusCode, answer)
	}
	p.record(out, resp.StatusCode)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(answer)
}

// upgrade checks an upgrade's exchange (its 101 answer has no body), then
// passes the two connections' bytes through until either side closes: a
// websocket's frames go through unchecked, since the document says nothing
// of them.
func (p *Proxy) upgrade(w http.ResponseWriter, r *http.Request, out *http.Request, body []byte, invalid bool, resp *http.Response) {
	x := Exchange{Request: out, RequestBody: body, Status: resp.StatusCode, Header: resp.Header}
	check := p.spec.Check
	if invalid {
		check = p.spec.CheckAnswer
	}
	if err := check(x); err != nil {
		p.t.Errorf("%v\nrequest: %s %s\nanswer: %d (upgrade)", err, r.Method, r.URL, resp.StatusCode)
	}
	p.record(out, resp.StatusCode)
	target, ok := resp.Body.(io.ReadWriter)
	if !ok {
		http.Error(w, "the upgraded answer is not a connection", http.StatusBadGateway)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	if err := brw.Flush(); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(target, brw) // what the client had sent already comes first
		done <- struct{}{}
	}()
	go func() {
		io.Copy(conn, target)
		done <- struct{}{}
	}()
	<-done
	// One side is done: closing both ends the other copy.
	conn.Close()
	resp.Body.Close()
	<-done
}

func (p *Proxy) record(r *http.Request, status int) {
	op := r.Method + " " + r.URL.Path
	if route, _, err := p.spec.router.FindRoute(r); err == nil {
		op = r.Method + " " + route.Path
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.seen[op], status) {
		p.seen[op] = append(p.seen[op], status)
	}
}

// Seen returns every operation that went through the proxy, as
// "METHOD /path/{template}", with the statuses it was answered.
func (p *Proxy) Seen() map[string][]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]int{}
	for k, v := range p.seen {
		out[k] = slices.Sorted(slices.Values(v))
	}
	return out
}

// WantSeen fails the test unless every one of ops ("METHOD /path status")
// went through the proxy.
func (p *Proxy) WantSeen(ops ...string) {
	p.t.Helper()
	seen := p.Seen()
	for _, want := range ops {
		found := false
		for op, statuses := range seen {
			for _, st := range statuses {
				if fmt.Sprintf("%s %d", op, st) == want {
					found = true
				}
			}
		}
		if !found {
			p.t.Errorf("no exchange %q went through the proxy (seen: %v)", want, seen)
		}
	}
}
