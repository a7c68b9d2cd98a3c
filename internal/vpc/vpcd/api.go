package vpcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/sled-agent/sled-agent/internal/httpbound"
	"github.com/sled-agent/sled-agent/internal/vpc/mappings"
	"github.com/sled-agent/sled-agent/internal/vpc/rules"
)

// The local API, on a unix socket only root reaches, mirrors OPTE's
// commands:
//
//	GET    /boot           the name of this run of the data path
//	GET    /state          the whole data path (State)
//	PUT    /ports/{name}   make or change a port (PortSpec)
//	DELETE /ports/{name}   remove it (absent: 204 all the same)
//	PUT    /ports/{name}/firewall  replace its firewall rules
//	POST   /ports/{name}/routes    remove and add router entries (RouteChange)
//	PUT    /ports/{name}/external-ips  replace its external addresses (ExternalChange)
//	POST   /ports/{name}/attach-subnet  attach a subnet (AttachSubnet; again: no change)
//	POST   /ports/{name}/detach-subnet  detach one ({"cidr": …}; absent: 204 all the same)
//	PUT    /v2p            set a mapping (V2P)
//	DELETE /v2p            clear one (by VNI and virtual IP)
//	PUT    /v2b            make the boundary table what the routing daemon says
//
// Answers are 204, GET /state 200 with JSON; a refusal is 400 with
// {"message": …}.

// portBody bounds a port's spec: its firewall rules are most of it
// (upstream's largest sets are about 1,024 rules).
var portBody = httpbound.Sized(4 << 20)

// Handler serves d's local API.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	fail := func(w http.ResponseWriter, status int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]string{"message": msg})
	}
	decode := func(w http.ResponseWriter, r *http.Request, v any) bool {
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			st, msg := httpbound.Status(err)
			if st == 0 || st == http.StatusInternalServerError {
				st, msg = http.StatusBadRequest, "body: "+err.Error()
			}
			fail(w, st, msg)
			return false
		}
		return true
	}
	done := func(w http.ResponseWriter, err error) {
		switch {
		case err == nil:
			w.WriteHeader(http.StatusNoContent)
		case errors.Is(err, ErrBadPort):
			fail(w, http.StatusBadRequest, err.Error())
		case errors.Is(err, ErrNoPort):
			fail(w, http.StatusNotFound, err.Error())
		default:
			fail(w, http.StatusInternalServerError, err.Error())
		}
	}
	route := func(pattern string, rt httpbound.Route, h http.HandlerFunc) {
		mux.Handle(pattern, rt.Handler(h, fail))
	}
	route("GET /boot", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"boot": d.boot})
	})
	route("GET /state", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(d.State())
	})
	route("PUT /ports/{name}", portBody, func(w http.ResponseWriter, r *http.Request) {
		var spec PortSpec
		if decode(w, r, &spec) {
			done(w, d.EnsurePort(r.PathValue("name"), spec))
		}
	})
	route("DELETE /ports/{name}", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		d.DeletePort(r.PathValue("name"))
		done(w, nil)
	})
	route("PUT /ports/{name}/firewall", portBody, func(w http.ResponseWriter, r *http.Request) {
		var rs []rules.FirewallRule
		if decode(w, r, &rs) {
			done(w, d.SetFirewall(r.PathValue("name"), rs))
		}
	})
	route("POST /ports/{name}/routes", httpbound.Sized(1<<20), func(w http.ResponseWriter, r *http.Request) {
		var c RouteChange
		if decode(w, r, &c) {
			class := rules.System
			switch c.Class {
			case "system":
			case "custom":
				class = rules.Custom
			default:
				fail(w, http.StatusBadRequest, fmt.Sprintf("class %q: want system or custom", c.Class))
				return
			}
			done(w, d.ApplyRoutes(r.PathValue("name"), class, c.Del, c.Add))
		}
	})
	route("PUT /ports/{name}/external-ips", httpbound.Sized(1<<20), func(w http.ResponseWriter, r *http.Request) {
		var c ExternalChange
		if decode(w, r, &c) {
			done(w, d.SetExternalIPs(r.PathValue("name"), c.ExternalIPs, c.EIPGateways))
		}
	})
	route("POST /ports/{name}/attach-subnet", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		var s AttachSubnet
		if decode(w, r, &s) {
			done(w, d.AttachSubnet(r.PathValue("name"), s))
		}
	})
	route("POST /ports/{name}/detach-subnet", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		var s DetachSubnet
		if decode(w, r, &s) {
			done(w, d.DetachSubnet(r.PathValue("name"), s.CIDR))
		}
	})
	route("PUT /v2p", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		var m V2P
		if decode(w, r, &m) {
			done(w, d.SetV2P(m))
		}
	})
	route("DELETE /v2p", httpbound.Small, func(w http.ResponseWriter, r *http.Request) {
		var m V2P
		if decode(w, r, &m) {
			d.ClearV2P(m)
			done(w, nil)
		}
	})
	route("PUT /v2b", httpbound.Sized(1<<20), func(w http.ResponseWriter, r *http.Request) {
		var want []mappings.Boundary
		if decode(w, r, &want) {
			m := map[netip.Prefix][]mappings.TEP{}
			for _, b := range want {
				m[b.Prefix] = append(m[b.Prefix], b.TEPs...)
			}
			_, err := d.eng.V2B().Replace(m)
			done(w, wrapBad(err))
		}
	})
	return mux
}

// Serve serves d's local API on the unix socket at path (made 0600, a stale
// one replaced) until ctx ends.
func (d *Daemon) Serve(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("vpcd: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	srv := httpbound.NewServer(d.Handler())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	os.Remove(path)
	return nil
}

// RouteChange is a change of a port's router entries of one class.
type RouteChange struct {
	Class string        `json:"class" enum:"system,custom"`
	Del   []rules.Route `json:"del"`
	Add   []rules.Route `json:"add"`
}

// Client talks to a data path's local API.
type Client struct {
	hc *http.Client
}

// DefaultTimeout bounds each call of a Client.
const DefaultTimeout = 10 * time.Second

// NewClient is a client of the data path listening on the unix socket at
// path.
func NewClient(path string) *Client {
	return &Client{hc: &http.Client{Timeout: DefaultTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}}
}

// APIError is a refusal of the data path's API.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("vpcd answered %d: %s", e.Status, e.Message) }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vpcd"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("vpcd: %w (is the data path running?)", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e struct{ Message string }
		json.Unmarshal(data, &e)
		return &APIError{Status: resp.StatusCode, Message: e.Message}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// Boot names the data path's run: it changes when the data path restarts,
// having lost what it was given.
func (c *Client) Boot(ctx context.Context) (string, error) {
	var b struct{ Boot string }
	err := c.do(ctx, http.MethodGet, "/boot", nil, &b)
	return b.Boot, err
}

// State is the data path's whole state.
func (c *Client) State(ctx context.Context) (State, error) {
	var st State
	err := c.do(ctx, http.MethodGet, "/state", nil, &st)
	return st, err
}

// EnsurePort makes or changes the port called name.
func (c *Client) EnsurePort(ctx context.Context, name string, spec PortSpec) error {
	return c.do(ctx, http.MethodPut, "/ports/"+name, spec, nil)
}

// DeletePort removes the port called name.
func (c *Client) DeletePort(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/ports/"+name, nil, nil)
}

// SetFirewall replaces the firewall rules of the port called name.
func (c *Client) SetFirewall(ctx context.Context, name string, rs []rules.FirewallRule) error {
	return c.do(ctx, http.MethodPut, "/ports/"+name+"/firewall", rs, nil)
}

// ApplyRoutes changes the router entries of the port called name.
func (c *Client) ApplyRoutes(ctx context.Context, name string, change RouteChange) error {
	return c.do(ctx, http.MethodPost, "/ports/"+name+"/routes", change, nil)
}

// SetExternalIPs replaces the external addresses of the port called name.
func (c *Client) SetExternalIPs(ctx context.Context, name string, ch ExternalChange) error {
	return c.do(ctx, http.MethodPut, "/ports/"+name+"/external-ips", ch, nil)
}

// AttachSubnet attaches a subnet to the port called name.
func (c *Client) AttachSubnet(ctx context.Context, name string, s AttachSubnet) error {
	return c.do(ctx, http.MethodPost, "/ports/"+name+"/attach-subnet", s, nil)
}

// DetachSubnet detaches a subnet from the port called name.
func (c *Client) DetachSubnet(ctx context.Context, name string, s DetachSubnet) error {
	return c.do(ctx, http.MethodPost, "/ports/"+name+"/detach-subnet", s, nil)
}

// DetachSubnet is the subnet to detach (OPTE's DetachSubnetReq).
type DetachSubnet struct {
	CIDR netip.Prefix `json:"cidr"`
}

// SetV2P sets a mapping.
func (c *Client) SetV2P(ctx context.Context, m V2P) error {
	return c.do(ctx, http.MethodPut, "/v2p", m, nil)
}

// ClearV2P clears a mapping.
func (c *Client) ClearV2P(ctx context.Context, m V2P) error {
	return c.do(ctx, http.MethodDelete, "/v2p", m, nil)
}

// SetV2B makes the boundary table want.
func (c *Client) SetV2B(ctx context.Context, want []mappings.Boundary) error {
	return c.do(ctx, http.MethodPut, "/v2b", want, nil)
}
