package propolisapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// The serial console, as upstream's (bin/propolis-server/src/lib/serial/
// and its history_buffer.rs):
//
// GET /instance/serial/history takes exactly one of from_start (an
// absolute offset) and most_recent (bytes back from the end), and
// max_bytes (16 KiB when absent). A from_start past the end reads nothing
// from the end; a most_recent beyond the start reads from the start. Bytes
// that are no longer held are a 400. last_byte_offset is the offset one
// past the last byte returned.
//
// GET /instance/serial upgrades to a websocket. With exactly one of
// from_start and most_recent, the history from there is sent first; with
// neither (or both, which upstream ignores alike) only new output is.
// Output goes as binary messages, in order and without gaps while the
// history holds it; binary messages from the client are written to the
// guest's com1 and text ones ignored. When the console ends, the server
// closes with 1001 "VM stopped". Upstream's one text control message,
// Migrating, has no use here: this server never migrates.
//
// Unlike upstream, where every reader waits for the slowest (and the guest
// for them all), each connection follows the history at its own pace: a
// reader that falls behind lags in the history and catches up, and one
// that falls out of it resumes at the oldest byte still held. A reader that
// takes none of a message for wsWriteTimeout is dropped.

const (
	// defaultMaxBytes is max_bytes when absent, as upstream's.
	defaultMaxBytes = 16 << 10
	// frameBytes is the most output one websocket message carries.
	frameBytes = 16 << 10
	// wsWriteTimeout bounds the sending of one message to a reader.
	wsWriteTimeout = 30 * time.Second
	// wsReadLimit caps one message of input.
	wsReadLimit = 64 << 10
)

// queryUints parses the named unsigned integer query parameters; an absent
// one is nil.
func queryUints(r *http.Request, names ...string) (map[string]*uint64, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("unable to parse query string: %w", err)
	}
	out := make(map[string]*uint64, len(names))
	for _, name := range names {
		vals, ok := q[name]
		if !ok {
			continue
		}
		if len(vals) > 1 {
			return nil, fmt.Errorf("unable to parse query string: duplicate field `%s`", name)
		}
		n, err := strconv.ParseUint(vals[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("unable to parse query string: %s: %q is not an unsigned integer", name, vals[0])
		}
		out[name] = &n
	}
	return out, nil
}

// startOffset is where a request's from_start or most_recent points, given
// the end of the output, clamped as upstream clamps it. ok is false unless
// exactly one of them is given.
func startOffset(fromStart, mostRecent *uint64, end uint64) (from uint64, ok bool) {
	switch {
	case fromStart != nil && mostRecent == nil:
		return min(*fromStart, end), true
	case mostRecent != nil && fromStart == nil:
		return end - min(*mostRecent, end), true
	}
	return 0, false
}

// expired is upstream's refusal of bytes no longer held.
func expired(from, end, held uint64) string {
	return fmt.Sprintf("Requested byte offset %d (-%d) is no longer cached: the output from offset %d on is held, out of a total %d bytes of output",
		from, end-from, held, end)
}

// console is the instance's console; nil when there is no instance (or no
// console yet, as upstream's VM that is not active).
func (h *handler) console() Console {
	if _, _, _, ok := h.b.Instance(); !ok {
		return nil
	}
	return h.b.Console()
}

func (h *handler) serialHistory(w http.ResponseWriter, r *http.Request) {
	q, err := queryUints(r, "from_start", "most_recent", "max_bytes")
	if err != nil {
		writeError(w, http.StatusBadRequest, "", err.Error())
		return
	}
	con := h.console()
	if con == nil {
		writeNoInstance(w)
		return
	}
	end := con.End()
	from, ok := startOffset(q["from_start"], q["most_recent"], end)
	if !ok {
		writeError(w, http.StatusBadRequest, "", "Exactly one of 'from_start' or 'most_recent' must be specified.")
		return
	}
	maxBytes := defaultMaxBytes
	if m := q["max_bytes"]; m != nil {
		maxBytes = int(min(*m, math.MaxInt))
	}
	data, start := con.Read(from, maxBytes)
	if start != from {
		writeError(w, http.StatusBadRequest, "", expired(from, end, start))
		return
	}
	writeJSON(w, http.StatusOK, historyResponse{Data: data, LastByteOffset: start + uint64(len(data))})
}

// checkUpgrade returns what makes r no websocket upgrade, in dropshot's
// words, or "".
func checkUpgrade(r *http.Request) string {
	has := func(header, token string) bool {
		for _, v := range r.Header.Values(header) {
			for _, t := range strings.FieldsFunc(v, func(c rune) bool { return c == ',' || c == ' ' }) {
				if strings.EqualFold(t, token) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case !has("Connection", "upgrade"):
		return "expected connection upgrade"
	case !has("Upgrade", "websocket"):
		return "unexpected protocol for upgrade"
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return "missing or invalid websocket version"
	case r.Header.Get("Sec-WebSocket-Key") == "":
		return "missing websocket key"
	}
	return ""
}

// serial upgrades to the console's websocket. What upstream refuses on the
// upgraded connection (no instance, history no longer held) is refused
// here before the upgrade, with the status and body of the history's
// refusal, so that the client can tell what is wrong.
func (h *handler) serial(w http.ResponseWriter, r *http.Request) {
	q, err := queryUints(r, "from_start", "most_recent")
	if err != nil {
		writeError(w, http.StatusBadRequest, "", err.Error())
		return
	}
	if msg := checkUpgrade(r); msg != "" {
		writeError(w, http.StatusBadRequest, "", msg)
		return
	}
	con := h.console()
	if con == nil {
		writeNoInstance(w)
		return
	}
	end := con.End()
	from, history := startOffset(q["from_start"], q["most_recent"], end)
	if !history {
		from = end
	} else if _, start := con.Read(from, 0); start != from {
		writeError(w, http.StatusBadRequest, "", expired(from, end, start))
		return
	}
	// Upstream checks no origin: its clients are the agent and Nexus on
	// the underlay, never a browser.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		h.log.Warn("serial console upgrade failed", "err", err)
		return
	}
	c.SetReadLimit(wsReadLimit)
	s := &serialSession{c: c, con: con, log: h.log.With("request_id", w.Header().Get(requestIDHeader))}
	s.run(r.Context(), from)
}

// serialSession is one websocket reader of the console.
type serialSession struct {
	c   *websocket.Conn
	con Console
	log *slog.Logger
}

// run streams output from offset from and takes input, until the client
// goes, the console ends or ctx does.
//
// The input's reads are never cancelled by a context, since cancelling a
// read closes the connection at once: the connection is closed first, as
// the case deserves, and that ends them.
func (s *serialSession) run(ctx context.Context, from uint64) {
	s.log.Debug("serial console connected", "from", from)
	wctx, cancel := context.WithCancel(ctx) // for writes to the guest
	defer cancel()
	quit := make(chan struct{})
	var inputErr error
	go func() {
		defer close(quit)
		inputErr = s.input(context.WithoutCancel(ctx), wctx)
	}()
	switch s.output(ctx, quit, from) {
	case outputStopped:
		s.c.Close(websocket.StatusGoingAway, "VM stopped")
	case outputCancelled:
		s.c.Close(websocket.StatusGoingAway, "server shutting down")
	case outputQuit:
		if inputErr != nil { // quit is closed: inputErr is set
			s.log.Warn("serial console input failed", "err", inputErr)
			s.c.Close(websocket.StatusInternalError, "writing to the serial port failed")
		} else {
			s.c.CloseNow()
		}
	case outputFailed:
		s.c.CloseNow()
	}
	cancel()
	<-quit
	s.log.Debug("serial console disconnected")
}

// Why output ends.
type outputEnd int

const (
	outputStopped   outputEnd = iota // the console ended
	outputCancelled                  // ctx ended
	outputQuit                       // input ended: the client went
	outputFailed                     // a send failed
)

// output sends the console's output from offset off until the console
// ends, ctx ends, quit is closed or a send fails.
func (s *serialSession) output(ctx context.Context, quit <-chan struct{}, off uint64) outputEnd {
	for {
		data, start := s.con.Read(off, frameBytes)
		if start > off {
			s.log.Debug("serial console reader resumes past output no longer held", "from", off, "to", start)
		}
		off = start
		if len(data) > 0 {
			wctx, cancel := context.WithTimeout(ctx, wsWriteTimeout)
			err := s.c.Write(wctx, websocket.MessageBinary, data)
			cancel()
			switch {
			case err == nil:
			case ctx.Err() != nil:
				return outputCancelled
			default:
				return outputFailed
			}
			off += uint64(len(data))
			continue
		}
		select {
		case <-ctx.Done():
			return outputCancelled
		case <-quit:
			return outputQuit
		case <-s.con.Notify(off):
			if s.con.End() <= off {
				return outputStopped // woken with nothing new: the console ended
			}
		}
	}
}

// errNoProgress is a console Write that took nothing and said nothing.
var errNoProgress = errors.New("serial port took no input")

// input writes the client's binary messages to the console, under wctx,
// until the connection closes (nil) or a write fails.
func (s *serialSession) input(rctx, wctx context.Context) error {
	for {
		typ, p, err := s.c.Read(rctx)
		if err != nil {
			return nil // the client closed, or the connection was closed
		}
		if typ != websocket.MessageBinary {
			continue // upstream ignores text from clients
		}
		for len(p) > 0 {
			n, err := s.con.Write(wctx, p)
			switch {
			case err != nil && wctx.Err() != nil:
				return nil
			case err != nil:
				return fmt.Errorf("writing to the serial port: %w", err)
			case n == 0:
				return errNoProgress
			}
			p = p[n:]
		}
	}
}

// historyResponse is upstream's InstanceSerialConsoleHistoryResponse.
type historyResponse struct {
	Data           byteArray `json:"data"`
	LastByteOffset uint64    `json:"last_byte_offset"`
}

// byteArray is bytes as a JSON array of numbers, as upstream sends a
// Vec<u8>.
type byteArray []byte

func (b byteArray) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, 2+4*len(b))
	out = append(out, '[')
	for i, c := range b {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(c), 10)
	}
	return append(out, ']'), nil
}

func (b *byteArray) UnmarshalJSON(data []byte) error {
	var nums []uint16
	if err := json.Unmarshal(data, &nums); err != nil {
		return fmt.Errorf("want an array of bytes: %w", err)
	}
	out := make([]byte, len(nums))
	for i, n := range nums {
		if n > math.MaxUint8 {
			return fmt.Errorf("want an array of bytes: %d at %d is not a byte", n, i)
		}
		out[i] = byte(n)
	}
	*b = out
	return nil
}
