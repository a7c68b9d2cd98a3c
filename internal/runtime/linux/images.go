package linux

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
)

// Images maps a zone type to the image its zones run, as the agent's config
// file gives them. Each image is either a command line, which is ready when
// it accepts TCP connections:
//
//	{"crucible": ["/usr/bin/crucible-downstairs", "run", "--address", "{listen}"]}
//
// or an object with the command and how it is ready (one of tcp, http,
// command; default tcp):
//
//	{"crucible": {"command": ["/usr/bin/x", "--listen", "{listen}"],
//	              "ready": {"http": {"path": "/healthz", "status": 200}}}}
//
// Decoding checks the shape; Validate checks the values.
type Images map[string]Image

// UnmarshalJSON decodes the images, naming the zone type of a bad one.
func (m *Images) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	out := make(Images, len(raw))
	for kind, r := range raw {
		var img Image
		if err := json.Unmarshal(r, &img); err != nil {
			return fmt.Errorf("images: %q: %w", kind, err)
		}
		out[kind] = img
	}
	*m = out
	return nil
}

// UnmarshalJSON decodes an image of either form. Unknown fields are errors.
func (img *Image) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var argv []string
		if err := json.Unmarshal(b, &argv); err != nil {
			return fmt.Errorf("command: %w", err)
		}
		*img = Image{Command: argv}
		return nil
	}
	if len(b) == 0 || b[0] != '{' {
		return errors.New(`want a command line ["/path", "arg", ...] or {"command": [...], "ready": {...}}`)
	}
	var v struct {
		Command []string         `json:"command"`
		Ready   *json.RawMessage `json:"ready"`
	}
	if err := strictDecode(b, &v); err != nil {
		return err
	}
	*img = Image{Command: v.Command}
	if v.Ready != nil && string(bytes.TrimSpace(*v.Ready)) != "null" {
		if err := strictDecode(*v.Ready, &img.Ready); err != nil {
			return fmt.Errorf("ready: %w", err)
		}
		if img.Ready.kinds() == 0 {
			return errors.New("ready: want one of tcp, http, command")
		}
	}
	return nil
}

func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Validate checks every image: a known zone type, a command, and a
// readiness check that makes sense. Its error names the zone type and the
// field.
func (m Images) Validate() error {
	for _, kind := range slices.Sorted(maps.Keys(m)) {
		if !sledconfig.KnownZoneType(kind) {
			return fmt.Errorf("%q: not a known zone type", kind)
		}
		if err := m[kind].validate(); err != nil {
			return fmt.Errorf("%q: %w", kind, err)
		}
	}
	return nil
}

func (img Image) validate() error {
	if err := validArgv("command", img.Command); err != nil {
		return err
	}
	return img.Ready.validate()
}

func (rd Ready) kinds() int {
	n := 0
	for _, set := range []bool{rd.TCP != nil, rd.HTTP != nil, rd.Command != nil} {
		if set {
			n++
		}
	}
	return n
}

func (rd Ready) validate() error {
	if rd.kinds() > 1 {
		return errors.New("ready: want one of tcp, http, command, not several")
	}
	if h := rd.HTTP; h != nil {
		if h.Path != "" && (!strings.HasPrefix(h.Path, "/") || strings.ContainsAny(h.Path, "# ") || strings.ContainsFunc(h.Path, isControl)) {
			return fmt.Errorf("ready.http.path %q: want an absolute path like /healthz (no spaces, control characters or #)", h.Path)
		}
		if h.Status != 0 && (h.Status < 100 || h.Status > 599) {
			return fmt.Errorf("ready.http.status %d: want an HTTP status, 100 to 599", h.Status)
		}
	}
	if rd.Command != nil {
		if err := validArgv("ready.command", rd.Command); err != nil {
			return err
		}
		// The agent runs it itself, without a shell or a PATH search.
		if a := rd.Command[0]; !strings.HasPrefix(a, "/") && !strings.HasPrefix(a, "{agent}") && !strings.HasPrefix(a, "{root}") {
			return fmt.Errorf("ready.command[0] %q: want an absolute path (or {agent} or {root})", a)
		}
	}
	return nil
}

func validArgv(field string, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("%s: want a non-empty command", field)
	}
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("%s[%d]: contains a NUL byte", field, i)
		}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
