package propolisapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// clientReadLimit caps one message of output: upstream sends history in
// messages of 16 KiB.
const clientReadLimit = 1 << 20

// SerialConn is a connection to an instance's serial console: output
// comes from ReadOutput, input goes through WriteInput. ReadOutput and
// WriteInput may be called at once from two goroutines, but neither from
// two at once.
type SerialConn struct {
	c       *websocket.Conn
	timeout time.Duration
}

// MigratingError is upstream's Migrating control message: the instance
// moved to the propolis-server at Destination, whose console goes on
// from offset FromStart. This package's server never sends it.
type MigratingError struct {
	Destination string
	FromStart   uint64
}

func (e *MigratingError) Error() string {
	return fmt.Sprintf("propolis-server serial console: the instance migrated to %s (output goes on from offset %d)", e.Destination, e.FromStart)
}

// SerialConnect connects to the instance's serial console, sending the
// output from off first (the zero SerialOffset: only new output). A
// refusal is an *APIError: before Ensure it matches ErrNoInstance. The
// handshake runs under Timeout; the connection lives until Close or ctx
// ends.
func (c *Client) SerialConnect(ctx context.Context, off SerialOffset) (*SerialConn, error) {
	if c.err != nil {
		return nil, c.err
	}
	const path = "/instance/serial"
	u := "http://" + c.addr + path
	if q := off.query(); len(q) > 0 {
		u += "?" + q.Encode()
	}
	hctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DialContext:       (&net.Dialer{Timeout: c.timeout()}).DialContext,
		DisableKeepAlives: true,
	}}
	ws, resp, err := websocket.Dial(hctx, u, &websocket.DialOptions{
		HTTPClient: hc,
		HTTPHeader: http.Header{versionHeader: {APIVersion}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, answerError(http.MethodGet, path, resp)
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("propolis-server GET %s: %w", path, err)
		}
		return nil, fmt.Errorf("%w: GET %s: %w", ErrUnreachable, path, err)
	}
	ws.SetReadLimit(clientReadLimit)
	return &SerialConn{c: ws, timeout: c.timeout()}, nil
}

// answerError is the *APIError of a refused upgrade.
func answerError(method, path string, resp *http.Response) *APIError {
	e := &APIError{Method: method, Path: path, StatusCode: resp.StatusCode}
	var data []byte
	if resp.Body != nil {
		data, _ = io.ReadAll(io.LimitReader(resp.Body, 1024))
	}
	var b errorBody
	if json.Unmarshal(data, &b) == nil && (b.Message != "" || b.RequestID != "") {
		e.RequestID, e.ErrorCode, e.Message = b.RequestID, b.ErrorCode, b.Message
	} else {
		e.Message = strings.Join(strings.Fields(strings.ToValidUTF8(string(data), "")), " ")
	}
	return e
}

// controlMessage is upstream's InstanceSerialConsoleControlMessage.
type controlMessage struct {
	Migrating *struct {
		Destination string `json:"destination"`
		FromStart   uint64 `json:"from_start"`
	} `json:"Migrating"`
}

// ReadOutput returns the next piece of the console's output, waiting for
// it until ctx ends. When the server closes the console normally (the VM
// stopped: 1001), the error wraps io.EOF; upstream's Migrating message is
// a *MigratingError; other text messages are skipped.
func (s *SerialConn) ReadOutput(ctx context.Context) ([]byte, error) {
	for {
		typ, p, err := s.c.Read(ctx)
		if err != nil {
			switch st := websocket.CloseStatus(err); st {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway:
				ce, _ := errors.AsType[websocket.CloseError](err)
				return nil, fmt.Errorf("propolis-server serial console closed (%s): %w", ce.Reason, io.EOF)
			}
			return nil, fmt.Errorf("propolis-server serial console: %w", err)
		}
		if typ == websocket.MessageBinary {
			return p, nil
		}
		var m controlMessage
		if json.Unmarshal(p, &m) == nil && m.Migrating != nil {
			return nil, &MigratingError{Destination: m.Migrating.Destination, FromStart: m.Migrating.FromStart}
		}
	}
}

// WriteInput sends p to the guest as one message, under the client's
// Timeout.
func (s *SerialConn) WriteInput(ctx context.Context, p []byte) error {
	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.Write(wctx, websocket.MessageBinary, p); err != nil {
		return fmt.Errorf("propolis-server serial console: %w", err)
	}
	return nil
}

// Close closes the connection: it says goodbye to the server, waiting for
// its answer a few seconds at most.
func (s *SerialConn) Close() error {
	return s.c.Close(websocket.StatusNormalClosure, "")
}
