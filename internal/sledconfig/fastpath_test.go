package sledconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// The tests here check each shortcut Parse and Validate take against the
// longer way round it stands for, on the mutated test documents.

// corpus is every other document of mutatedDocs (which are many alike),
// made once for the tests here: making them takes seconds under the race
// detector.
func corpus(t testing.TB) [][]byte {
	corpusOnce.Do(func() {
		for i, doc := range mutatedDocs(t) {
			if i%2 == 0 {
				corpusDocs = append(corpusDocs, doc)
			}
		}
	})
	return corpusDocs
}

var (
	corpusOnce sync.Once
	corpusDocs [][]byte
)

// TestCanonicalAsWrittenAgrees checks that a document found to be in
// canonical form already (tree.asWritten), whose canonical form is then a
// copy, gets the canonical form, and node offsets, that writing it out
// gives; and that every document in canonical form is found to be.
func TestCanonicalAsWrittenAgrees(t *testing.T) {
	asWritten := 0
	for i, doc := range corpus(t) {
		docs := [][]byte{doc}
		// Variants of one document in four are enough (and reading
		// them all takes long under the race detector).
		if c, err := Canonicalize(doc); err == nil && i%4 == 0 {
			// In canonical form; and but for white space; but for the
			// order of members; but for an escape.
			var indented, unsorted bytes.Buffer
			v, err := decodeDocument(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := errors.Join(json.Indent(&indented, c, "", " "), json.Compact(&unsorted, reversed(v))); err != nil {
				t.Fatal(err)
			}
			escaped := bytes.Replace(c, []byte(`"id"`), []byte(`"\u0069d"`), 1)
			docs = append(docs, c, indented.Bytes(), unsorted.Bytes(), escaped)
		}
		for _, d := range docs {
			if !utf8.Valid(d) {
				continue
			}
			fast, ok := parseTree(d)
			if !ok {
				continue
			}
			slow, _ := parseTree(d)
			slow.asWritten = false // write it out
			got, want := fast.canonicalize(), slow.canonicalize()
			if !bytes.Equal(got, want) {
				t.Fatalf("canonical form of %.200s:\n got %s\nwant %s", d, got, want)
			}
			for i := range fast.nodes {
				if f, s := fast.nodes[i], slow.nodes[i]; f.start != s.start || f.end != s.end {
					t.Fatalf("%.200s: node %d at %d-%d, written out at %d-%d", d, i, f.start, f.end, s.start, s.end)
				}
			}
			// The parser may take a document for rewritten that is not
			// (one with an escape, or a character whose first byte is
			// that of U+2028), never the other way.
			mayMiss := bytes.IndexByte(d, '\\') >= 0 || bytes.IndexByte(d, 0xE2) >= 0
			if canonical := bytes.Equal(d, want); fast.asWritten != canonical && !(canonical && mayMiss) {
				t.Fatalf("%.200s: asWritten is %v, but the document is %vits canonical form", d, fast.asWritten, map[bool]string{false: "not "}[canonical])
			}
			if fast.asWritten {
				asWritten++
			}
		}
	}
	if asWritten < 100 {
		t.Fatalf("only %d documents in canonical form", asWritten)
	}
}

// TestStringScanAtEveryOffset puts each byte the string scan stops at (and
// some it must not) at each offset of a string, around the eight-byte
// steps the scan takes.
func TestStringScanAtEveryOffset(t *testing.T) {
	for _, stop := range []string{`"`, `\n`, `\"`, `\u00e9`, "\x01", "\x1f", "\u2028", "\u2029", "€", "é", " ", "\x7f"} {
		for before := range 20 {
			for _, after := range []string{"", "abc", "abcdefghijklmnop"} {
				doc := `{"k":"` + strings.Repeat("a", before) + stop + after + `","l":1}`
				checkTreeAgrees(t, []byte(doc))
			}
		}
	}
}

// TestParseChecksCaseWhenNeeded checks Parse, which looks for keys that
// differ from a field name only in letter case only when decoding met a
// key that is no field's name, against looking for them first, as the
// first of Parse's errors.
func TestParseChecksCaseWhenNeeded(t *testing.T) {
	caseErrors := 0
	for _, doc := range corpus(t) {
		_, got := Parse(doc)
		want := parseCheckingCaseFirst(doc)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%.300s:\nParse says %v\nchecking case first: %v", doc, got, want)
		}
		if _, ok := want.(*caseError); ok {
			caseErrors++
		}
	}
	if caseErrors < 20 {
		t.Fatalf("only %d documents with keys in another letter case", caseErrors)
	}
}

// parseCheckingCaseFirst is what Parse does up to decoding the zones,
// looking for keys in another letter case first.
func parseCheckingCaseFirst(data []byte) error {
	if len(data) > MaxDocumentBytes {
		return fmt.Errorf("config is %d bytes, more than the limit of %d", len(data), MaxDocumentBytes)
	}
	t, err := readTree(data)
	if err != nil {
		return err
	}
	root := t.root()
	if err := checkCase(t, root, planFor(reflect.TypeFor[Config]())); err != nil {
		return err
	}
	canonical := t.canonicalize()
	cfg, zones, _, err := decodeTop(t, root)
	if err != nil {
		return err
	}
	cfg.canonical = canonical
	_, err = decodeZones(cfg, t, zones)
	return err
}

// TestItemsAnswerAsTheTree checks what Parse keeps of each disk and
// dataset for validation (the members it has, its id) against the
// document read by decodeDocument.
func TestItemsAnswerAsTheTree(t *testing.T) {
	n := 0
	for _, doc := range corpus(t) {
		cfg, err := Parse(doc)
		if err != nil {
			continue
		}
		full, err := decodeDocument(doc)
		if err != nil {
			t.Fatal(err)
		}
		n += checkItems(t, cfg.disks, full["disks"])
		n += checkItems(t, cfg.datasets, full["datasets"])
	}
	if n < 5000 {
		t.Fatalf("only %d items checked", n)
	}
}

func checkItems[T any](t *testing.T, items []item[T], section any) int {
	t.Helper()
	members, _ := section.(map[string]any)
	keys := sortedKeys(members)
	if len(items) != len(keys) {
		t.Fatalf("%d items, %d members", len(items), len(keys))
	}
	for i, key := range keys {
		it := &items[i]
		obj, isObject := members[key].(map[string]any)
		if it.key != key || it.object != isObject {
			t.Fatalf("item %d: key %q (object %v), want %q (%v)", i, it.key, it.object, key, isObject)
		}
		if !isObject {
			continue
		}
		for _, path := range askedOf[T]().paths {
			if got, want := it.has(path), hasPath(obj, path); got != want {
				t.Fatalf("item %q: has(%q) = %v, want %v", key, path, got, want)
			}
		}
		id, hasID := obj["id"]
		s, isString := id.(string)
		switch {
		case !hasID && it.idKind != 0, hasID && id == nil && it.idKind != 'n':
			t.Fatalf("item %q: id kind %q for id %v", key, it.idKind, id)
		case isString && (it.idKind != '"' || it.id != s):
			t.Fatalf("item %q: id %q (kind %q), want %q", key, it.id, it.idKind, s)
		case hasID && !isString && it.idKind == '"':
			t.Fatalf("item %q: id kind string for %v", key, id)
		}
	}
	return len(keys)
}

// hasPath reports whether obj has a member at the dotted path, not null.
func hasPath(obj map[string]any, path string) bool {
	name, rest, nested := strings.Cut(path, ".")
	v, ok := obj[name]
	if !nested {
		return ok && v != nil
	}
	sub, ok := v.(map[string]any)
	return ok && hasPath(sub, rest)
}

// TestValidateAfterOtherParses checks that a config validates as it did
// right after Parse once other documents have been parsed (which reuse
// the nodes Parse let go of).
func TestValidateAfterOtherParses(t *testing.T) {
	docs := corpus(t)
	var cfgs []*Config
	var want []string
	for _, doc := range docs {
		cfg, err := Parse(doc)
		if err != nil {
			continue
		}
		cfgs = append(cfgs, cfg)
		want = append(want, fmt.Sprint(Validate(cfg)))
	}
	// Every config but the last has been followed by other parses.
	for i, cfg := range cfgs {
		if got := fmt.Sprint(Validate(cfg)); got != want[i] {
			t.Fatalf("config %d validates as\n%s\nafter other parses, as\n%s\nright after its own", i, got, want[i])
		}
	}
}

// TestItemIDNotAString checks the message for an id that is not a string,
// whose JSON Validate reads again from the item's.
func TestItemIDNotAString(t *testing.T) {
	for _, id := range []string{`5`, `{ "b": [1, 2.50], "a": "\u0041" }`, `true`} {
		doc := `{"generation": 1, "datasets": {}, "zones": {}, "measurements": [],
			"disks": {"k": {"id": ` + id + `, "pool_id": "6340805e-c5af-418d-8bd1-fc0085667f33",
				"identity": {"vendor": "v", "model": "m", "serial": "s"}}}}`
		cfg, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		c, err := Canonicalize([]byte(id))
		if err != nil {
			c = []byte(id) // not an object
		}
		want := `disks["k"].id: ` + string(c) + ` is not a string`
		if err := Validate(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("id %s: %v, want %s", id, err, want)
		}
	}
}
