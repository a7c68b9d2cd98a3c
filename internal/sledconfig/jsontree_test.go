package sledconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
)

// mutatedDocs are the test configs, each mutated at random in many ways
// (values of other types, keys in other letter case, members removed,
// bytes removed, changed or inserted), deterministically.
func mutatedDocs(t testing.TB) [][]byte {
	var docs [][]byte
	seeds := append(smallDocs(t), exampleBytes(t), encode(t, fullDoc(t)), reversed(exampleDoc(t)))
	r := rand.New(rand.NewPCG(1, 2))
	for _, doc := range seeds {
		docs = append(docs, doc, doc[:len(doc)/2])
		for range 300 {
			var v any
			dec := json.NewDecoder(bytes.NewReader(doc))
			dec.UseNumber()
			if err := dec.Decode(&v); err != nil {
				continue
			}
			for range 1 + r.IntN(3) {
				v = mutate(r, v, 0)
			}
			b, _ := json.Marshal(v)
			docs = append(docs, b)
		}
		for range 100 {
			b := slices.Clone(doc)
			i := r.IntN(len(b))
			switch r.IntN(4) {
			case 0:
				b = append(b[:i], b[min(len(b), i+1+r.IntN(5)):]...)
			case 1:
				b[i] = `{}[]",:0\ea-.`[r.IntN(13)]
			case 2:
				b = slices.Insert(b, i, []byte(`"\u00e9\ud83d\ude00\u2028\n\/"`)...)
			case 3:
				b = slices.Insert(b, i, []byte("\u2028")...)
			}
			docs = append(docs, b)
		}
	}
	return docs
}

// randValue is a value of any JSON type, some of them ones a config has.
func randValue(r *rand.Rand) any {
	switch r.IntN(9) {
	case 0:
		return nil
	case 1:
		return true
	case 2:
		return json.Number([]string{"0", "-1", "1.5", "300", "1e3", "18446744073709551616", "9223372036854775808", "70000"}[r.IntN(8)])
	case 3:
		return []any{"a", json.Number("1")}
	case 4:
		return map[string]any{"type": "gzip_n", "x": "y"}
	case 5:
		return ""
	case 6:
		return "oxp_" + "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	case 7:
		return "zone/oxz_crucible_aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	}
	return "\u2028é\"x"
}

// mutate changes one value in v, below the top two levels where it can.
func mutate(r *rand.Rand, v any, depth int) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 || r.IntN(8) == 0 && depth > 0 {
			return randValue(r)
		}
		keys := slices.Sorted(maps.Keys(x))
		k := keys[r.IntN(len(keys))]
		if depth < 2 {
			var containers []string
			for _, k := range keys {
				switch x[k].(type) {
				case map[string]any, []any:
					containers = append(containers, k)
				}
			}
			if len(containers) > 0 {
				k = containers[r.IntN(len(containers))]
				x[k] = mutate(r, x[k], depth+1)
				return x
			}
		}
		switch r.IntN(6) {
		case 0:
			delete(x, k)
		case 1:
			x[strings.ToUpper(k[:1])+k[1:]] = x[k]
			if r.IntN(2) == 0 {
				delete(x, k)
			}
		default:
			x[k] = mutate(r, x[k], depth+1)
		}
		return x
	case []any:
		if len(x) == 0 || r.IntN(6) == 0 {
			return randValue(r)
		}
		i := r.IntN(len(x))
		x[i] = mutate(r, x[i], depth+1)
		return x
	}
	return randValue(r)
}

// TestTreeAgreesWithDecodeDocument checks parseTree against decodeDocument,
// the token decoder whose messages Parse gives: both refuse the same
// documents, and parseTree's canonical form is encodeCanonical's.
func TestTreeAgreesWithDecodeDocument(t *testing.T) {
	docs := append(mutatedDocs(t),
		[]byte(`{"x": 1.50e+3, "y": "\u2028<\ud800>", "z": [[], {}, null, true]}`),
		[]byte(`{"a":"\ud83d\ude00\u00e9\n\"\\\/\u001f\u007f é \u2029"}`),
		[]byte(`{"a":-0.0e-0,"b":01}`), []byte(`{"a":"\udc00"}`), []byte(`{"a":1,"a":2}`),
		[]byte(`{"b":{},"a":[]} `), []byte(`{} {}`), []byte(`[]`), []byte(`"x"`), []byte(` `),
		[]byte(strings.Repeat("[", maxNesting)+strings.Repeat("]", maxNesting)),
		[]byte(`{"a":`+strings.Repeat("[", maxNesting-1)+strings.Repeat("]", maxNesting-1)+`}`),
		[]byte(`{"a":`+strings.Repeat("[", maxNesting)+strings.Repeat("]", maxNesting)+`}`),
	)
	for _, doc := range docs {
		checkTreeAgrees(t, doc)
	}
}

func FuzzTree(f *testing.F) {
	for _, d := range smallDocs(f) {
		f.Add(d)
	}
	f.Add([]byte(`{"a":"\ud83d\ude00\u2028","b":[1e5,-0.5,true,null,{}]}`))
	f.Fuzz(checkTreeAgrees)
}

func checkTreeAgrees(t *testing.T, doc []byte) {
	if !utf8.Valid(doc) {
		return // refused before either reads it
	}
	tr, ok := parseTree(doc)
	want, err := decodeDocument(doc)
	var notObject bool
	if errors.Is(err, errNotObject) {
		notObject, err = true, nil
	}
	switch {
	case !ok && err == nil:
		t.Fatalf("parseTree refuses what decodeDocument takes: %.200s", doc)
	case ok && err != nil:
		t.Fatalf("parseTree takes what decodeDocument refuses (%v): %.200s", err, doc)
	case !ok || notObject:
		return
	}
	wantCanon, err := encodeCanonical(want)
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.canonicalize(); !bytes.Equal(got, wantCanon) {
		t.Fatalf("canonical form of %.200s:\n got %s\nwant %s", doc, got, wantCanon)
	}
}

// TestDecodeAgreesWithEncodingJSON checks the decoder against
// encoding/json on every zone, disk and dataset of the mutated documents:
// the same values, and the same first type mismatch.
func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	n := 0
	for _, doc := range mutatedDocs(t) {
		if !utf8.Valid(doc) {
			continue
		}
		tr, ok := parseTree(doc)
		if !ok || tr.root().kind != '{' {
			continue
		}
		canonical := tr.canonicalize()
		for _, section := range []string{"zones", "disks", "datasets"} {
			m := tr.member(tr.root(), section)
			if m == nil || m.kind != '{' {
				continue
			}
			kids := tr.kids(m)
			for i := range kids {
				k := &kids[i]
				raw := canonical[k.start:k.end]
				switch section {
				case "zones":
					checkDecode[Zone](t, tr, k, raw)
				case "disks":
					checkDecode[DiskConfig](t, tr, k, raw)
				default:
					checkDecode[DatasetConfig](t, tr, k, raw)
				}
				n++
			}
		}
	}
	if n < 10000 {
		t.Fatalf("only %d values decoded", n)
	}
}

func checkDecode[T any](t *testing.T, tr *tree, n *node, raw []byte) {
	t.Helper()
	var got, want T
	d := decoder{t: tr}
	var gotErr error // nil, not a nil *json.UnmarshalTypeError, if it decodes
	if err := d.decode(n, reflect.ValueOf(&got).Elem(), planFor(reflect.TypeFor[T]())); err != nil {
		gotErr = err
	}
	wantErr := json.Unmarshal(raw, &want)
	var g, w *json.UnmarshalTypeError
	switch {
	case (gotErr == nil) != (wantErr == nil):
		t.Fatalf("%s: error %v, encoding/json's %v", raw, gotErr, wantErr)
	case gotErr != nil && !errors.As(wantErr, &w):
		t.Fatalf("%s: encoding/json says %v", raw, wantErr)
	case gotErr != nil:
		errors.As(gotErr, &g)
		if g.Value != w.Value || g.Type != w.Type || g.Field != w.Field || g.Struct != w.Struct {
			t.Fatalf("%s: error %+v, encoding/json's %+v", raw, *g, *w)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: decoded %+v, encoding/json %+v", raw, got, want)
	}
}

// TestMatchersAgreeWithTheirDefinitions checks the name and UUID matchers,
// and the eight-byte-at-a-time ones, against the patterns or plainer code
// they stand for.
func TestMatchersAgreeWithTheirDefinitions(t *testing.T) {
	var prefixes []string
	for _, p := range zoneKinds {
		prefixes = append(prefixes, regexp.QuoteMeta(p))
	}
	zoneName := regexp.MustCompile(`^` + ZoneNamePrefix + `(` + strings.Join(prefixes, "|") +
		`)_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	zpool := regexp.MustCompile(`^ox[ip]_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	hash := regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	lowerUUID := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	lowerUUIDv4 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	isUUIDSlowly := func(s string) bool {
		_, err := uuid.Parse(s)
		return len(s) == 36 && err == nil
	}
	mayFoldSlowly := func(s string) bool {
		for _, r := range s {
			if 'A' <= r && r <= 'Z' || r >= utf8.RuneSelf {
				return true
			}
		}
		return false
	}
	matchers := []struct {
		name      string
		got, want func(string) bool
	}{
		{"isZoneName", isZoneName, zoneName.MatchString},
		{"isZpoolName", isZpoolName, zpool.MatchString},
		{"isArtifactHash", isArtifactHash, hash.MatchString},
		{"isUUID", isUUID, isUUIDSlowly},
		{"isLowerUUID(·, false)", func(s string) bool { return isLowerUUID(s, false) }, lowerUUID.MatchString},
		{"isLowerUUID(·, true)", func(s string) bool { return isLowerUUID(s, true) }, lowerUUIDv4.MatchString},
		{"mayFold", mayFold, mayFoldSlowly},
	}
	const id = "b0000000-0000-4000-8000-00000000000a"
	seeds := []string{"oxp_" + id, "oxi_" + id, "oxz_crucible_" + id, "oxz_crucible_pantry_" + id,
		"oxz_ntp_" + id, "oxz__" + id, strings.Repeat("ab", 32), strings.Repeat("AB", 32), "",
		id, "B0AAAAAA-AAAA-4AAA-8AAA-FFFFFFFFFFFF", "0123abcd-ef01-4bcd-9f01-23456789abcd",
		"zones", "Zones", "datasets", "é", "abcdefghijklmnopqrstuvwxyz"}
	r := rand.New(rand.NewPCG(3, 4))
	// The bytes either side of each range the matchers take, and some.
	alphabet := "0123456789abcdefABCDEFxo_-pizA4893/:`g@GZ\x00\x7f\x80\xc3\xe2\xff"
	for _, s := range seeds {
		for range 5000 {
			b := []byte(s)
			for range 1 + r.IntN(2) {
				switch i := r.IntN(len(b) + 1); {
				case i == len(b) || r.IntN(4) == 0:
					b = slices.Insert(b, min(i, len(b)), alphabet[r.IntN(len(alphabet))])
				case r.IntN(3) == 0:
					b = slices.Delete(b, i, i+1)
				default:
					b[i] = alphabet[r.IntN(len(alphabet))]
				}
			}
			for _, m := range matchers {
				for _, c := range []string{s, string(b)} {
					if got, want := m.got(c), m.want(c); got != want {
						t.Fatalf("%s(%q) = %v, its definition says %v", m.name, c, got, want)
					}
				}
			}
		}
	}
}
