package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// A copy file is one line of JSON followed by a newline:
//
//	{"format":1,"generation":7,"sha256":"<64 hex digits>","data":<document>}
//
// The document is stored inline, byte for byte as committed, so the file is
// as readable as the document itself. The checksum is SHA-256 over the
// decimal generation, a newline, and the document bytes, so a change to the
// generation is detected as well as a change to the data. By hand:
//
//	printf '7\n%s' "$document" | sha256sum
//
// The envelope is written by hand rather than by json.Marshal, which would
// re-encode (compact and HTML-escape) the document; it is read with
// json.RawMessage, which keeps the document's bytes exactly as stored.
const formatVersion = 1

const (
	// MaxDataBytes bounds the document Commit stores; a real sled config is a
	// few hundred KiB, a 10,000-zone one about 4 MiB.
	MaxDataBytes = 16 << 20
	// maxCopySize bounds a copy file: the document plus the envelope.
	maxCopySize = MaxDataBytes + 1024
)

// checksum is the hex SHA-256 over "<generation>\n" followed by data.
func checksum(generation uint64, data []byte) string {
	h := sha256.New()
	h.Write(strconv.AppendUint(nil, generation, 10))
	h.Write([]byte{'\n'})
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// checkData reports whether a record's data can be stored: a single JSON
// value with no surrounding whitespace (which the envelope could not give
// back exactly), no larger than MaxDataBytes. The JSON of data its committer
// has checked (Record.Checked) is not read again.
func checkData(rec Record) error {
	data := rec.Data
	switch {
	case len(data) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidData)
	case len(data) > MaxDataBytes:
		return fmt.Errorf("%w: %d bytes is more than the limit of %d", ErrInvalidData, len(data), MaxDataBytes)
	case isJSONSpace(data[0]) || isJSONSpace(data[len(data)-1]):
		return fmt.Errorf("%w: leading or trailing whitespace", ErrInvalidData)
	case !rec.Checked && !json.Valid(data):
		return fmt.Errorf("%w: not valid JSON", ErrInvalidData)
	}
	return nil
}

func isJSONSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// encodeCopy returns the contents of a copy file holding rec. rec.Data must
// have passed checkData.
func encodeCopy(rec Record) []byte {
	b := make([]byte, 0, len(rec.Data)+128)
	b = append(b, `{"format":`...)
	b = strconv.AppendInt(b, formatVersion, 10)
	b = append(b, `,"generation":`...)
	b = strconv.AppendUint(b, rec.Generation, 10)
	b = append(b, `,"sha256":"`...)
	b = append(b, checksum(rec.Generation, rec.Data)...)
	b = append(b, `","data":`...)
	b = append(b, rec.Data...)
	b = append(b, "}\n"...)
	return b
}

// envelope is the decoded form of a copy file. Pointers tell a missing
// member from a zero one.
type envelope struct {
	Format     *int            `json:"format"`
	Generation *uint64         `json:"generation"`
	SHA256     *string         `json:"sha256"`
	Data       json.RawMessage `json:"data"`
}

// decodeCopy validates the contents of a copy file and returns its record.
// The error says what is wrong, for a human.
func decodeCopy(b []byte) (Record, error) {
	switch {
	case len(b) == 0:
		return Record{}, errors.New("empty file")
	case len(b) > maxCopySize:
		return Record{}, fmt.Errorf("file is larger than %d bytes", maxCopySize)
	case b[len(b)-1] != '\n':
		return Record{}, errors.New("file does not end in a newline (truncated?)")
	}
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return Record{}, fmt.Errorf("not a valid envelope: %w", err)
	}
	switch {
	case env.Format == nil:
		return Record{}, errors.New(`no "format" member`)
	case *env.Format != formatVersion:
		return Record{}, fmt.Errorf("unsupported format %d (want %d)", *env.Format, formatVersion)
	case env.Generation == nil:
		return Record{}, errors.New(`no "generation" member`)
	case env.SHA256 == nil:
		return Record{}, errors.New(`no "sha256" member`)
	case env.Data == nil:
		return Record{}, errors.New(`no "data" member`)
	}
	if got := checksum(*env.Generation, env.Data); got != *env.SHA256 {
		return Record{}, fmt.Errorf("checksum mismatch: file says %q, generation %d and data hash to %q",
			abbrev(*env.SHA256), *env.Generation, abbrev(got))
	}
	return Record{Generation: *env.Generation, Data: env.Data}, nil
}

// abbrev shortens a checksum for messages.
func abbrev(s string) string {
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}
