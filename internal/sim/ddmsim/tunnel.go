package ddmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"

	"github.com/sled-agent/sled-agent/internal/ddm"
	"github.com/sled-agent/sled-agent/internal/sim/simhttp"
)

// Peer is the one peer every tunnel route is learned through: the switch
// that, in a rack, hands each sled the tunnel endpoints originated
// anywhere (its own sled's too) and is the nexthop ddmd records.
var Peer = netip.MustParseAddr("fe80::aa:1")

// TunnelOrigins is a sorted snapshot of the originated tunnel endpoints.
func (s *Server) TunnelOrigins() []ddm.TunnelOrigin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tunnelOriginsLocked()
}

func (s *Server) tunnelOriginsLocked() []ddm.TunnelOrigin {
	out := slices.AppendSeq(make([]ddm.TunnelOrigin, 0, len(s.tunnels)), maps.Keys(s.tunnels))
	slices.SortFunc(out, ddm.CompareTunnelOrigins)
	return out
}

// TunnelRoutes is what GET /tunnel_endpoints answers: every originated
// endpoint, learned through Peer, sorted.
func (s *Server) TunnelRoutes() []ddm.TunnelRoute {
	origins := s.TunnelOrigins()
	out := make([]ddm.TunnelRoute, len(origins))
	for i, o := range origins {
		out[i] = ddm.TunnelRoute{Nexthop: Peer, Origin: o}
	}
	return out
}

func (s *Server) serveOriginatedTunnels(rp *simhttp.Reply, _ *http.Request) {
	rp.JSON(http.StatusOK, s.TunnelOrigins())
}

func (s *Server) serveTunnelRoutes(rp *simhttp.Reply, _ *http.Request) {
	rp.JSON(http.StatusOK, s.TunnelRoutes())
}

// serveTunnel serves PUT and DELETE /tunnel_endpoint.
func (s *Server) serveTunnel(rp *simhttp.Reply, r *http.Request) {
	origins, err := readOrigins(r)
	if err != nil {
		rp.Error(http.StatusBadRequest, "", err.Error())
		return
	}
	s.mu.Lock()
	for _, o := range origins {
		if r.Method == http.MethodPut {
			s.tunnels[o] = struct{}{}
		} else {
			delete(s.tunnels, o)
		}
	}
	s.mu.Unlock()
	rp.NoContent()
}

// readOrigins decodes a body that must be a JSON array of tunnel origins.
func readOrigins(r *http.Request) ([]ddm.TunnelOrigin, error) {
	data, err := simhttp.ReadBody(r)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(bytes.TrimSpace(data), []byte("[")) {
		return nil, errors.New("unable to parse JSON body: expected an array of tunnel origins")
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("unable to parse JSON body: %w", err)
	}
	out := make([]ddm.TunnelOrigin, 0, len(raw))
	for i, item := range raw {
		o, err := decodeOrigin(item)
		if err != nil {
			return nil, fmt.Errorf("unable to parse JSON body: origin %d: %w", i, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// decodeOrigin decodes one TunnelOrigin as ddmd does (unknown fields
// ignored, metric 0 when absent), and refuses a VNI over 24 bits, which
// ddmd stores but no Geneve header can carry.
func decodeOrigin(data []byte) (ddm.TunnelOrigin, error) {
	var o ddm.TunnelOrigin
	if !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		return o, fmt.Errorf("%s: expected an object", data)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return o, err
	}
	field := func(name string, required bool, v any) error {
		raw, ok := fields[name]
		switch {
		case !ok && required:
			return fmt.Errorf("missing field `%s`", name)
		case !ok:
			return nil
		case string(bytes.TrimSpace(raw)) == "null":
			return fmt.Errorf("%s: null is not a value", name)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	var prefix, boundary string
	for _, f := range []struct {
		name     string
		required bool
		v        any
	}{{"overlay_prefix", true, &prefix}, {"boundary_addr", true, &boundary}, {"vni", true, &o.VNI}, {"metric", false, &o.Metric}} {
		if err := field(f.name, f.required, f.v); err != nil {
			return o, err
		}
	}
	var err error
	if o.OverlayPrefix, err = netip.ParsePrefix(prefix); err != nil {
		return o, fmt.Errorf("overlay_prefix %q is not an IP net", prefix)
	}
	if o.BoundaryAddr, err = netip.ParseAddr(boundary); err != nil || !o.BoundaryAddr.Is6() || o.BoundaryAddr.Zone() != "" {
		return o, fmt.Errorf("boundary_addr %q is not an IPv6 address", boundary)
	}
	if o.VNI > ddm.MaxVNI {
		return o, fmt.Errorf("vni %d is over 24 bits", o.VNI)
	}
	return o, nil
}
